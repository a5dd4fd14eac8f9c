"""One rank of test_rank_decisions.py and test_compile_ddp.py:

    python -m tests.training._decisions_worker MODE ARG

joins the gloo group that torchrun-style variables describe, takes one of the decisions every
rank must share and prints what it decided as one JSON line on stdout.

  plan GIBS    `--batch-size auto` as train.py plans it, this GPU reporting GIBS[rank] GiB
  batch SIZES  `--batch-size SIZES[rank]`, then the check that all ranks planned alike
  compile SPEC the tiny model's training step compiled under DDP (SPEC: JSON, below), 2 steps
"""

from __future__ import annotations

import json
import logging
import sys

import torch

from src.errors import UserError
from src.training.distributed import cleanup, init_distributed

CUDA = torch.device("cuda", 0)


def _plan(env, gibs: list[float]) -> dict:
    # No GPU can run here: torch is made to report one of `gibs[rank]` GiB; the cost model
    # measures on FakeTensors and needs none.
    from src.open_alip import get_model_config
    from src.training.agreement import check_same_plan
    from src.training.batching import plan_for_device

    class Properties:
        total_memory = int(gibs[env.rank] * 2**30)

    torch.cuda.get_device_properties = lambda device: Properties()
    plan, checkpointing, why = plan_for_device(
        model_config=get_model_config("RWKV_CLIP_tiny"),
        wkv_impl="chunked",
        precision="bf16",
        device=CUDA,
        world_size=env.world_size,
        global_batch=8192,
        accum_freq=None,
        batch_size=None,
        force_checkpointing=False,
        env=env,
    )
    check_same_plan(plan, checkpointing, env)
    return {"micro": plan.micro_batch, "accum": plan.accum_freq, "checkpointing": checkpointing, "why": why}


def _batch(env, sizes: list[int]) -> dict:
    from src.training.agreement import check_same_plan
    from src.training.batching import plan_for_device

    plan, checkpointing, _ = plan_for_device(
        model_config={},
        wkv_impl="chunked",
        precision="fp32",
        device=env.device,
        world_size=env.world_size,
        global_batch=None,
        accum_freq=None,
        batch_size=sizes[env.rank],
        force_checkpointing=False,
        env=env,
    )
    check_same_plan(plan, checkpointing, env)
    return {"micro": plan.micro_batch}


def _failing_backend(fail_on_rank: int):
    """A dynamo backend that fails to compile on one rank, as a broken toolchain on one node would;
    elsewhere it runs the traced graph as it is."""
    import torch.distributed as dist

    def backend(gm, example_inputs):
        if dist.get_rank() == fail_on_rank:
            raise RuntimeError(f"the stand-in compiler cannot compile on rank {fail_on_rank}")
        return gm.forward

    return backend


def _compile(env, spec: dict) -> dict:
    """spec: {"config": name, "overrides": {...}, "backend": [per rank], "fail_on_rank": r or null,
    "batch": n, "accum": n}. Returns what the steps did, for the test to compare across ranks."""
    from torch._dynamo import list_backends, register_backend
    from torch._dynamo.utils import counters

    from src.training.config import build_config
    from src.training.main import build_training_step
    from src.training.observe import setup_logging

    if spec.get("fail_on_rank") is not None and "rwkv_clip_test_fails_on_one_rank" not in list_backends(()):
        register_backend(_failing_backend(spec["fail_on_rank"]), name="rwkv_clip_test_fails_on_one_rank")
    setup_logging(None, env.rank)  # rank 0 logs to stdout, the others warnings to stderr
    logging.getLogger("torch").setLevel(logging.ERROR)
    cfg = build_config(
        {
            "config": spec["config"],
            "batch_size": spec["batch"],
            "wkv_impl": "chunked",
            "compile": True,
            "compile_backend": spec["backend"][env.rank],
            "precision": "fp32",
            "device": "cpu",
            "train_data": ["(generated batches)"],
            "output": spec["output"],
            "global_batch_size": spec["batch"] * spec["accum"] * env.world_size,
        },
        spec.get("overrides", {}),
    )
    trainer, plan = build_training_step(cfg, env, total_steps=4)
    g = torch.Generator().manual_seed(env.rank)
    size, ctx = cfg.model["input_size"], cfg.model["ctx_len"]
    micro = [
        (
            torch.randn(plan.micro_batch, 3, size, size, generator=g),
            torch.randint(1, 49406, (plan.micro_batch, ctx), generator=g),
        )
        for _ in range(plan.accum_freq)
    ]
    losses = [float(trainer.step(micro, step).loss) for step in range(2)]
    params = torch.cat([p.detach().flatten() for p in trainer.raw_model.parameters()])
    return {
        "losses": losses,
        "param_sum": float(params.double().sum()),
        "param_norm": float(params.double().norm()),
        "compiled": hasattr(trainer.model, "_orig_mod"),
        "accum": plan.accum_freq,
        "graphs": int(counters["stats"]["unique_graphs"]),
        "drop_path": [
            float(getattr(m, "p", 0.0)) for m in trainer.raw_model.modules() if type(m).__name__ == "DropPath"
        ],
    }


if __name__ == "__main__":
    mode, arg = sys.argv[1], json.loads(sys.argv[2])
    env = init_distributed("cpu", timeout_s=120)
    try:
        result = {"plan": _plan, "batch": _batch, "compile": _compile}[mode](env, arg)
    except UserError as exc:  # TrainingError is one: the line every rank stops with
        result = {"error": str(exc)}
    finally:
        cleanup(env)
    print(json.dumps(result), flush=True)
