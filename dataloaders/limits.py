"""Loader settings the CLIs need before anything heavy is imported (no torch, no DALI): their
one owner, which train.py's settings, dali.py's flags and the loader itself read."""

BACKENDS = ("dali", "torch")  # the DALI loader, and its pure-PyTorch fallback

# A run stops when a process knows of more bad records than this: one damaged image must not
# end a 26-hour run, but a wrong or broken dataset must stop within minutes, not after
# warning about every record. 100 is under 0.001% of YFCC15M.
DEFAULT_MAX_BAD_RECORDS = 100

# Reader processes per rank for the DALI loader (dataloaders/read_ahead.py), where each rank has
# cores to spare for them; on a small machine they only add copies and switches.
READER_WORKERS = 2
READER_MIN_CORES = 4  # per process on the node (torchrun's LOCAL_WORLD_SIZE) for "auto" to use them
READER_WORKERS_HELP = (
    "processes per rank reading records for the DALI loader, off the training thread's GIL; 0 reads in a "
    f"thread (default: {READER_WORKERS} where each local process has {READER_MIN_CORES} or more cores, "
    "else 0)"
)
