"""Loader settings the CLIs need before anything heavy is imported (no torch, no DALI)."""

# A run stops when a process knows of more bad records than this: one damaged image must not
# end a 26-hour run, but a wrong or broken dataset must stop within minutes, not after
# warning about every record. 100 is under 0.001% of YFCC15M.
DEFAULT_MAX_BAD_RECORDS = 100
