"""The cost model (src/perf/cost_model.py, measuring through step_trace.py), the planner
(src/perf/planner.py) and their CLI (benchmarks/training_cost.py).

Measurements run on FakeTensors; these tests hold them to an independent FLOP count, to
runs on real tensors, to direct runs at other batch sizes and depths, and check that
the planner keeps the global batch and the memory budget with 40, 80 and 141 GB devices.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

from benchmarks import training_cost as cli
from src.open_alip import get_model_config
from src.perf import cost_model as cm
from src.perf import planner
from src.perf import step_trace as trace
from tests._repo import REPO

GB = 10**9

# The tiny model with few tokens (4 image patches, 12 text tokens): quick to measure,
# and short enough for the reference WKV's per-token loops.
SMALL = get_model_config("RWKV_CLIP_tiny", ctx_len=12, input_size=16)
# Three image and four text blocks: the model is measured with two and extended.
DEEPER = get_model_config("RWKV_CLIP_tiny", ctx_len=12, input_size=16, image_depth=3, n_layer=4)


def _textbook_flops(cfg: dict) -> dict[str, float]:
    """Forward+backward FLOPs per sample from the architecture alone.

    Each weight matrix costs 2 FLOPs per weight per token forward and twice that
    backward; the patch embedding's backward has no input gradient. The WKV per token
    and head: two scans, each a read-out (2 N^2) and a state update (3 N^2), plus the
    bonus (4 N); backward twice the forward.
    """
    out = {}
    for tower in ("image", "text"):
        if tower == "image":
            c, layers = cfg["image_embed_dims"], cfg["image_depth"]
            hidden, heads = c * cfg["image_hidden_rate"], cfg["image_num_heads"]
            tokens = (cfg["input_size"] // cfg["image_patch_size"]) ** 2
        else:
            c, layers, hidden = cfg["n_embd"], cfg["n_layer"], cfg["dim_ffn"]
            heads, tokens = c // cfg["head_size"], cfg["ctx_len"]
        n = c // heads
        weights_per_layer = (
            5 * c * c  # receptance, key, value, gate, output
            + 2 * c * 160
            + 2 * c * 64  # token-shift LoRA (5 x 32) and decay LoRA (64)
            + 2 * c * hidden
            + c * c  # channel mix: key, value, receptance
        )
        total = 3 * 2 * tokens * weights_per_layer * layers
        total += 3 * tokens * heads * (10 * n * n + 4 * n) * layers
        if tower == "image":
            total += 2 * 2 * tokens * 3 * cfg["image_patch_size"] ** 2 * c
        out[tower] = float(total)
    return out


def test_flops_match_the_textbook_count():
    cost = cm.estimate_cost(SMALL)
    expected = _textbook_flops(SMALL)
    for tower in cost.towers:
        assert tower.flops == pytest.approx(expected[tower.name], rel=1e-3)
        assert tower.counted_wkv_flops > 0  # the chunked form's own matmuls were seen and taken out
    assert cost.flops_per_sample == pytest.approx(sum(expected.values()), rel=1e-3)
    parts = cm.analytic_flops(SMALL)
    assert {t: sum(p.values()) for t, p in parts.items()} == pytest.approx(expected, rel=1e-9)


def test_fake_tensors_measure_what_real_tensors_do():
    fake, real = (
        trace.run_step(
            SMALL, 3, impl="chunked", precision="bf16", device_type="cuda", checkpointing=False, fake=f
        )
        for f in (True, False)
    )
    assert fake.retained == real.retained
    assert fake.saved == real.saved
    assert fake.flops == real.flops
    assert max(fake.timeline) == max(real.timeline)


def test_memory_is_linear_in_batch():
    cost = cm.estimate_cost(SMALL)
    for batch in (5,):
        run = trace.run_step(
            SMALL, batch, impl="chunked", precision="bf16", device_type="cuda", checkpointing=False
        )
        for tower in cost.towers:
            retained = sum(v for k, v in run.retained.items() if k.startswith(tower.name))
            saved = sum(v for k, v in run.saved.items() if k.startswith(tower.name))
            assert retained == pytest.approx(tower.retained.at(batch), abs=1)
            assert saved == pytest.approx(tower.saved.at(batch), abs=1)
            assert tower.retained.per_sample > 0
        assert max(run.timeline) == pytest.approx(cost.activation_bytes(batch, False), abs=1)


def test_deeper_models_are_extended_from_the_measured_depth():
    cost = cm.estimate_cost(DEEPER)
    assert (cost.image.layers, cost.text.layers) == (3, 4)
    batch = 4
    for cp in (False, True):
        run = trace.run_step(
            DEEPER, batch, impl="chunked", precision="bf16", device_type="cuda", checkpointing=cp
        )
        for tower in cost.towers:
            retained = sum(v for k, v in run.retained.items() if k.startswith(tower.name))
            assert retained == pytest.approx((tower.retained_cp if cp else tower.retained).at(batch), abs=1)
        direct, predicted = max(run.timeline), cost.activation_bytes(batch, cp)
        # Extra blocks are assumed alive all through backward: never less, and close.
        assert direct <= predicted + 1
        assert predicted <= 1.1 * direct
        if not cp:
            counted = sum(t.flops - t.wkv_flops + t.counted_wkv_flops for t in cost.towers)
            assert counted == pytest.approx(sum(run.flops.values()) / batch, rel=1e-9)
    n_params = sum(p.numel() for p in trace.build_model(DEEPER, fake=False).parameters())
    assert cost.params == n_params


def test_a_wkv_measured_apart_gives_the_same_memory():
    direct = cm.estimate_cost(SMALL, wkv_impl="reference")
    apart = cm.estimate_cost(SMALL, wkv_impl="reference", wkv_apart=True)
    assert any("measured alone" in note for note in apart.notes)
    for a, b in zip(direct.towers, apart.towers):
        assert b.saved.per_sample == pytest.approx(a.saved.per_sample, rel=1e-6)
        assert b.retained.per_sample == pytest.approx(a.retained.per_sample, rel=1e-6)
        assert b.flops == pytest.approx(a.flops, rel=1e-9)
    for cp in (False, True):
        exact, swapped = direct.activation_bytes(64, cp), apart.activation_bytes(64, cp)
        assert exact <= swapped + 1  # the swap may only err on the side of more memory
        assert swapped <= 1.25 * exact
    # The reference keeps every step's state: more memory than the chunked form.
    shape = direct.text.wkv
    assert cm.wkv_footprint("reference", shape).retained > cm.wkv_footprint("chunked", shape).retained


def test_cuda_autocast_rules_are_scoped():
    x = torch.randn(4, dtype=torch.bfloat16, requires_grad=True)
    with trace.cuda_autocast_rules(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.square(x).dtype == torch.float32  # pow runs in float32 under CUDA autocast
        assert torch.relu(x).dtype == torch.bfloat16
        y = torch.square(x)
    y.sum().backward()
    assert x.grad.dtype == torch.bfloat16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.square(x).dtype == torch.bfloat16  # CPU autocast's own rule is back


def test_upper_envelope_is_the_maximum_for_every_batch():
    rng = random.Random(0)
    lines = [
        cm.Linear(rng.uniform(0, 100), rng.choice([0.0, 0.5, 1.0, rng.uniform(0, 3)])) for _ in range(300)
    ]
    hull = cm.upper_envelope(lines)
    assert len(hull) < len(lines)
    for batch in range(1, 400):
        assert max(line.at(batch) for line in hull) == pytest.approx(max(line.at(batch) for line in lines))


@pytest.mark.parametrize("name", ["RWKV_CLIP_tiny", "RWKV_CLIP_B32", "RWKV_CLIP_B16"])
def test_the_planner_keeps_the_global_batch_and_the_memory_budget(name):
    cost = cm.estimate_cost(name)
    world, global_batch = 8, 4096
    per_gpu = global_batch // world
    plans = []
    for memory in (40 * GB, 80 * GB, 141 * GB):
        plan = planner.plan_micro_batch(
            name,
            wkv_impl="chunked",
            precision="bf16",
            device_memory_bytes=memory,
            global_batch=global_batch,
            world_size=world,
            cost=cost,
        )
        assert plan.micro_batch * plan.accum_steps * plan.world_size == plan.global_batch == global_batch
        assert plan.predicted_bytes <= plan.usable_bytes == planner.usable_bytes(memory)
        assert "\n" not in plan.explanation and f"micro-batch {plan.micro_batch}" in plan.explanation

        def need(micro: int, cp: bool, memory=memory) -> float:
            return cost.step_bytes(micro, per_gpu // micro, world, cp)["total"]

        # Nothing cheaper fits: one pass without checkpointing, then one pass with it.
        if (plan.micro_batch, plan.grad_checkpointing) != (per_gpu, False):
            assert need(per_gpu, False) > plan.usable_bytes
        if plan.accum_steps > 1:
            assert need(per_gpu, True) > plan.usable_bytes
            if not plan.grad_checkpointing:  # the largest micro-batch that fits
                bigger = [m for m in range(plan.micro_batch + 1, per_gpu + 1) if per_gpu % m == 0]
                assert all(need(m, False) > plan.usable_bytes for m in bigger)
        plans.append(plan)
    # More memory never makes the plan worse.
    cost_of = [(p.accum_steps > 1) + p.grad_checkpointing for p in plans]
    assert cost_of == sorted(cost_of, reverse=True)
    if name == "RWKV_CLIP_B32":  # the chunked WKV's 512-sample step needs more than 80 GB
        assert [(p.micro_batch, p.grad_checkpointing) for p in plans[1:]] == [(512, True), (512, False)]


def test_the_planner_refuses_what_cannot_work():
    cost = cm.estimate_cost(SMALL)
    kwargs = dict(wkv_impl="chunked", precision="bf16", cost=cost)
    with pytest.raises(ValueError, match="does not split evenly over 3 GPUs"):
        planner.plan_micro_batch(
            SMALL, device_memory_bytes=80 * GB, global_batch=4096, world_size=3, **kwargs
        )
    with pytest.raises(ValueError, match="more memory"):
        planner.plan_micro_batch(SMALL, device_memory_bytes=2 * GB, global_batch=64, world_size=1, **kwargs)
    with pytest.raises(cm.CostModelError, match="unknown wkv implementation 'fast'"):
        cm.estimate_cost(SMALL, wkv_impl="fast")
    plan = planner.plan_micro_batch(
        SMALL,
        device_memory_bytes=80 * GB,
        global_batch=4096,
        world_size=8,
        allow_checkpointing=False,
        **kwargs,
    )
    assert not plan.grad_checkpointing
    # DDP's bucket copy of the gradients: none for one process or with gradient_as_bucket_view.
    copy, view = cost.step_bytes(64, 1, 8, False), cost.step_bytes(64, 1, 8, False, bucket_view=True)
    assert copy["total"] - view["total"] == copy["ddp_buckets"] == cost.grad_bytes
    assert cost.step_bytes(64, 1, 1, False)["ddp_buckets"] == 0


def test_cli_prints_the_costs_of_the_tiny_model(capsys, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # main() may set it; undone after the test
    # chunked: "auto" would import fla into this test process (see the next test).
    args = ["--config", "RWKV_CLIP_tiny", "--gpu", "h200", "--mfu", "0.3", "--wkv-impl", "chunked"]
    assert cli.main(args) == 0
    out = capsys.readouterr().out
    for expected in (
        "image tower",
        "text  tower",
        "total",
        "AdamW state",
        "Planner on H200",
        "At MFU 0.30 on H200",
        "32 epochs of YFCC15M (15,061,515 pairs) on 8 GPUs",
        "--config RWKV_CLIP_B32 prints the MFU",
    ):
        assert expected in out
    assert cli.main(["--config", "no_such_model"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("benchmarks.training_cost: error: model config 'no_such_model'")
        and err.count("\n") == 1
    )


def test_cli_measures_the_fla_wkv():
    # A fresh process: the CLI sets TRITON_INTERPRET=1 before fla is imported (no GPU
    # here), and fla's custom op then runs on FakeTensors through its shape-only kernel.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.training_cost", "--config", "RWKV_CLIP_tiny", "--wkv-impl", "fla"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "wkv fla;" in proc.stdout and "Planner on" in proc.stdout
    if not torch.cuda.is_available():
        assert "measured alone" not in proc.stdout


def test_cli_time_arithmetic():
    gpu = cli.GPU_SPECS["a100"]
    rate, mfu = cli.implied_mfu(40e9, 26.0, gpu)
    assert rate == pytest.approx(32 * 15_061_515 / (26 * 3600 * 8))
    assert mfu == pytest.approx(rate * 40e9 / 312e12)
    assert cli.run_hours(cli.samples_per_s(40e9, gpu, mfu)) == pytest.approx(26.0)
