"""One rank of test_rank_agreement.py: `python -m tests.training._agreement_worker DATA OUTPUT`
joins the gloo group torchrun-style variables describe and runs the start-up checks."""

import sys
from pathlib import Path

from dataloaders.shards import load_shards
from src.training.agreement import build_on_every_rank, check_same_data, check_shared_output
from src.training.distributed import cleanup, init_distributed
from src.training.errors import TrainingError

if __name__ == "__main__":
    data, output = sys.argv[1], Path(sys.argv[2])
    env = init_distributed("cpu", timeout_s=60)
    try:
        check_shared_output(output, env)
        check_same_data(build_on_every_rank(lambda: load_shards(data, cache_dir=output / "cache"), env), env)
        print("agreed")
    except TrainingError as exc:
        print(f"error: {exc}")
    finally:
        cleanup(env)
