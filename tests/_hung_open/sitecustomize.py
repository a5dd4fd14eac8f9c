"""Put on PYTHONPATH of a data2rec run under test, this is loaded by each of its Python processes,
the forkserver's workers included: opening the file named by $RWKV_CLIP_TEST_HUNG_FILE then never
returns, as a read from a hung network mount does not. It stands in for such a mount, which a test
cannot make; a FIFO no longer can (data2rec refuses to read one, src/fsutil.py's read_regular_file).
Only os.open is affected, which is how read_regular_file opens input files."""

import os

_hung = os.environ.get("RWKV_CLIP_TEST_HUNG_FILE")

if _hung:
    import time

    _os_open = os.open

    def _open(path, flags, *args, **kwargs):
        if os.fspath(path) == _hung:
            while True:  # until the test kills the run
                time.sleep(60)
        return _os_open(path, flags, *args, **kwargs)

    os.open = _open
