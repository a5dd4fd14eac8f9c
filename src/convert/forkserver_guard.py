"""Preloaded by the conversion's forkserver (see distributor.py): the forkserver dies with the
run that started it, and its workers (see worker.init_worker) die with the forkserver."""

import sys

from .processes import die_with_parent

# Only in the forkserver itself (started as `python -c "from multiprocessing.forkserver import main..."`):
# imported anywhere else, this module does nothing.
if sys.argv[:1] == ["-c"] and "multiprocessing.forkserver" in sys.modules:
    die_with_parent()
