"""train.py's epoch-end zero-shot hook in 2 real gloo processes: both ranks call it, each embeds
its share of the prompts and images, rank 0 returns the metrics of the whole dataset (the same as
one process evaluating alone) and rank 1 returns nothing. In one process: it evaluates at the
run's planned micro-batch, also the one `--batch-size auto` chose."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from PIL import Image

from src.evaluation.hook import zero_shot_epoch_hook
from src.evaluation.run import evaluate_classification
from src.evaluation.sharding import Shard
from src.evaluation.specs import DatasetSpec
from src.training.batching import BatchPlan, plan_for_device
from src.training.config import TrainConfig
from src.training.distributed import DistEnv, cleanup, init_distributed
from src.training.params import parse_config
from tests._eval_layouts import micro_model
from tests._train_helpers import free_port, run_guarded, set_torchrun_env


def _dataset(root: Path) -> DatasetSpec:
    """7 images in 3 classes and 3 templates: neither the images nor the 9 prompts split evenly."""
    colours = {
        "red": [(250, 10, 10), (200, 0, 30), (255, 60, 60)],
        "green": [(10, 240, 10), (40, 200, 40)],
        "blue": [(10, 10, 250), (0, 60, 200)],
    }
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
    # The run's settings and batch plan: micro-batches of 2 per process; workers=0 reads in this
    # process (train.py's --workers asks for at least 1 loader thread).
    config, plan = TrainConfig(train_data=("d",), output=root, workers=0), BatchPlan(2, 1, 2, None)
    metrics = hook(model, 1, config, plan, env)
    result = evaluate_classification(
        model, spec, 32, env.device, 2, 0, return_predictions=True, shard=Shard(env.rank, env.world_size)
    )
    (out / f"rank{rank}.json").write_text(
        json.dumps({"hook": metrics, "predictions": result["predictions"], "metrics": result["metrics"]})
    )
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


def test_the_hook_evaluates_at_the_planned_micro_batch(tmp_path):
    # --batch-size auto, as the recipes have it: the batch plan decides the micro-batch (here 3: a
    # global batch of 6 in 2 accumulated micro-batches), and the hook evaluates at that batch.
    config = parse_config(
        [
            "--train-data",
            "d",
            "--output",
            str(tmp_path / "run"),
            "--config",
            "RWKV_CLIP_tiny",
            "--batch-size",
            "auto",
            "--global-batch-size",
            "6",
            "--accum-freq",
            "2",
        ]
    )
    env = DistEnv(0, 0, 1, torch.device("cpu"), None)
    plan, _, _ = plan_for_device(
        model_config=config.model,
        wkv_impl="reference",
        precision=config.precision,
        device=env.device,
        world_size=1,
        global_batch=config.global_batch_size,
        accum_freq=config.accum_freq,
        batch_size=config.batch_size,
        force_checkpointing=False,
    )
    assert config.batch_size is None and plan.micro_batch == 3
    model = micro_model()
    batches: list[int] = []
    model.image_model.register_forward_pre_hook(lambda _module, args: batches.append(args[0].shape[0]))
    hook = zero_shot_epoch_hook(_dataset(tmp_path / "data"), frequency=1)
    # workers=0 reads in this process (train.py's --workers asks for at least 1 loader thread).
    metrics = hook(model, 1, dataclasses.replace(config, workers=0), plan, env)
    assert batches == [3, 3, 1] and set(metrics) == {
        "zeroshot_top1",
        "zeroshot_top5",
        "zeroshot_mean_per_class_recall",
    }
