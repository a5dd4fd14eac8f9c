"""Every rank takes the same decisions, with 2 real gloo processes: the batch plan of
`--batch-size auto` on GPUs of different memory, a disagreement about the plan, and a compile
failure on one rank only. Each would otherwise leave the ranks in collectives of different
shapes, a hang until --dist-timeout; every run here is bounded (run_ranks kills a hang).

No GPU and no broken compiler exist here: the GPU's reported memory is set per rank, and the
compile failure is a dynamo backend that raises on rank 1 alone (tests/training/_decisions_worker.py)."""

import json

from tests._train_helpers import run_ranks

WORKER = "tests.training._decisions_worker"


def _ranks(mode: str, arg) -> list[dict]:
    results = run_ranks(WORKER, [mode, json.dumps(arg)], timeout=300)
    for rank, (code, _, err) in enumerate(results):
        assert code == 0, f"rank {rank}: {err[-3000:]}"
    return [
        {**json.loads(out.strip().splitlines()[-1]), "stdout": out, "stderr": err} for _, out, err in results
    ]


def test_gpus_of_different_memory_get_one_plan_made_for_the_smallest():
    from src.open_alip import get_model_config
    from src.perf.planner import plan_micro_batch

    gibs = [8, 5]  # alone, these plan 1024 x 4 and 128 x 32 of the 4,096 per rank
    ranks = _ranks("plan", gibs)
    decided = {(r["micro"], r["accum"], r["checkpointing"]) for r in ranks}
    assert len(decided) == 1, ranks
    cfg = get_model_config("RWKV_CLIP_tiny")
    alone = [
        plan_micro_batch(
            cfg,
            wkv_impl="chunked",
            precision="bf16",
            device_memory_bytes=g << 30,
            global_batch=8192,
            world_size=2,
            bucket_view=True,
        )
        for g in gibs
    ]
    assert alone[0].micro_batch != alone[1].micro_batch  # each rank planning alone would disagree
    assert decided == {(alone[1].micro_batch, alone[1].accum_steps, alone[1].grad_checkpointing)}
    why = ranks[0]["why"]
    assert "smallest GPU of the 2 processes (rank 1: 5.4 GB; the largest 8.6 GB)" in why, why


def test_ranks_that_planned_differently_all_stop_with_one_line():
    ranks = _ranks("batch", [4, 2])  # as nodes started with different --batch-size would
    assert ranks[0]["error"] == ranks[1]["error"]
    assert ranks[0]["error"].startswith(
        "ranks planned different batches (rank 0: micro-batch 4 x accumulation 1, "
        "checkpointing off; rank 1: micro-batch 2 x"
    ), ranks[0]["error"]
    assert "\n" not in ranks[0]["error"]


def _warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if "WARNING: torch.compile" in line]


def _compile_spec(tmp_path, backends: list[str], fail_on_rank, accum: int) -> dict:
    return {
        "config": "RWKV_CLIP_tiny",
        "backend": backends,
        "fail_on_rank": fail_on_rank,
        "batch": 2,
        "accum": accum,
        "output": str(tmp_path),
    }


def test_a_compile_failure_on_one_rank_makes_every_rank_fall_back_together(tmp_path):
    # The compiler fails on rank 1 only, while tracing the first step; rank 0 compiled fine.
    name = "rwkv_clip_test_fails_on_one_rank"
    ranks = _ranks("compile", _compile_spec(tmp_path, [name, name], fail_on_rank=1, accum=1))
    assert [r["compiled"] for r in ranks] == [False, False]
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]  # the two ranks' steps stayed in step
    assert ranks[0]["losses"] == ranks[1]["losses"] and all(loss == loss for loss in ranks[0]["losses"])
    (line,) = _warnings(ranks[0]["stdout"])  # one line, from rank 0, naming the rank that failed
    assert f"torch.compile (backend {name}) failed on rank 1 of 2: " in line
    assert "cannot compile on rank 1" in line and "continues EAGERLY on every rank" in line
    assert not _warnings(ranks[1]["stderr"]) and not _warnings(ranks[1]["stdout"])


def test_a_backend_one_rank_cannot_load_makes_every_rank_fall_back_with_accumulation(tmp_path):
    # Rank 1 fails when the model is wrapped (an unknown backend name), rank 0 compiles; with
    # accumulation DDP runs without its static graph and the step has a gradient-free pass too.
    ranks = _ranks(
        "compile", _compile_spec(tmp_path, ["eager", "no_such_backend"], fail_on_rank=None, accum=2)
    )
    assert [r["compiled"] for r in ranks] == [False, False] and ranks[0]["accum"] == 2
    assert ranks[0]["param_sum"] == ranks[1]["param_sum"]
    (line,) = _warnings(ranks[0]["stdout"])
    assert "failed on rank 1 of 2: " in line and "no_such_backend" in line
    assert not _warnings(ranks[1]["stderr"])
