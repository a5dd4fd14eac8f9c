"""train.py's epoch-end zero-shot hook in 2 real gloo processes: both ranks call it, each embeds
its share of the prompts and images, rank 0 returns the metrics of the whole dataset (the same as
one process evaluating alone) and rank 1 returns nothing."""


import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.multiprocessing as mp
from PIL import Image

from src.evaluation.hook import zero_shot_epoch_hook
from src.evaluation.run import DatasetSpec, evaluate_classification
from src.evaluation.sharding import Shard
from src.training.distributed import cleanup, init_distributed
from tests._eval_layouts import micro_model
from tests._train_helpers import free_port, run_guarded, set_torchrun_env


def _dataset(root: Path) -> DatasetSpec:
    """7 images in 3 classes and 3 templates: neither the images nor the 9 prompts split evenly."""
    colours = {"red": [(250, 10, 10), (200, 0, 30), (255, 60, 60)], "green": [(10, 240, 10), (40, 200, 40)],
               "blue": [(10, 10, 250), (0, 60, 200)]}
    for name, shades in colours.items():
        for i, colour in enumerate(shades):
            (root / "tree" / name).mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (20 + 3 * i, 16), colour).save(root / "tree" / name / f"{i}.png")
    (root / "templates.json").write_text(json.dumps(["a photo of {}.", "{} colour", "the colour {}"]))
    return DatasetSpec("colours", root / "tree", templates=root / "templates.json")


def _body(rank: int, out: Path, port: int, root: Path) -> None:
    set_torchrun_env(rank, 2, port)
    env = init_distributed("cpu")
    spec = _dataset(root)
    model = micro_model()
    hook = zero_shot_epoch_hook(spec, frequency=1)
    args = SimpleNamespace(batch_size=2, workers=0)  # the run's per-GPU batch and loader workers
    metrics = hook(model, 1, args, env)
    result = evaluate_classification(model, spec, 32, env.device, 2, 0, return_predictions=True,
                                     shard=Shard(env.rank, env.world_size))
    (out / f"rank{rank}.json").write_text(json.dumps({"hook": metrics, "predictions": result["predictions"],
                                                      "metrics": result["metrics"]}))
    cleanup(env)


def _worker(rank: int, out: Path, port: int, root: Path) -> None:
    run_guarded(_body, rank, out, port, root)


def test_hook_spreads_the_evaluation_and_rank0_reports(tmp_path):
    root = tmp_path / "data"
    spec = _dataset(root)
    out = tmp_path / "out"
    out.mkdir()
    try:
        mp.spawn(_worker, args=(out, free_port(), root), nprocs=2, join=True)
    except Exception:
        errors = "\n".join(p.read_text() for p in sorted(out.glob("error_*.txt")))
        pytest.fail(f"gloo workers failed:\n{errors}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    alone = evaluate_classification(micro_model(), spec, 32, "cpu", batch_size=3, return_predictions=True)
    assert ranks[1]["hook"] == {}
    assert ranks[0]["hook"] == pytest.approx({f"zeroshot_{k}": v for k, v in alone["metrics"].items()})
    for rank in ranks:  # every rank gathered every image's prediction, in dataset order
        assert rank["predictions"] == alone["predictions"] and len(rank["predictions"]) == 7
        assert rank["metrics"] == pytest.approx(alone["metrics"])
    assert [Shard(r, 2).range(7) for r in range(2)] == [(0, 4), (4, 7)]
