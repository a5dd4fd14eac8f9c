"""What one RWKV-CLIP training sample costs: FLOPs, and memory as lines in the batch size.

    cost = estimate_cost("RWKV_CLIP_B32", wkv_impl="chunked", precision="bf16")
    cost.flops_per_sample                  # forward+backward model FLOPs of one pair
    cost.step_bytes(micro=256, accum=2, world_size=8, checkpointing=False)["total"]

The planner that picks a micro-batch from these figures is src/perf/planner.py.

How the numbers are obtained (on the CPU, no GPU needed, deterministic):

* The model runs forward and backward on FakeTensors (torch's shape-only tensors: the
  real autograd graph and autocast casts, no arithmetic), in training mode, under
  bf16/fp16 autocast when the precision asks for it, as the trainer runs it.
* FLOPs come from torch.utils.flop_counter.FlopCounterMode (matmuls and convolutions,
  forward and backward). The WKV is no matmul in its recurrent form, and its fast
  implementations are kernels the counter cannot see, so what the counter saw inside
  the WKV implementation is subtracted and the recurrent form is counted analytically
  (`wkv_flops`).
* Memory is read off the graph: a dispatch mode adds every storage the ops create and
  a weakref finaliser removes it when it dies (src/perf/step_trace.py). That gives the bytes
  alive after the forward pass (what backward keeps: "retained"), the live total after
  every op of forward+backward (the peak), and, through saved-tensor hooks, the bytes
  autograd saves for backward ("saved", the figure usually quoted). Parameters and
  gradients are counted apart (`CostModel.step_bytes`).
* Every storage is either batch-independent or proportional to the batch, so the live
  total after op t is a_t + b_t * batch: two runs (batch 2 and 3) give the peak at any
  batch as the upper envelope of those lines. The blocks of a tower are identical, so
  the model is measured with 1 and 2 blocks per tower and extended to the full depth
  (each further block adds its retained bytes). Tests check both against direct runs.
* CUDA autocast runs some ops in float32 that CPU autocast leaves in bf16 (pow, hence
  torch.square in the channel mixes). With device_type="cuda" those ops are cast the
  CUDA way while measuring (`step_trace.cuda_autocast_rules`).
* The fla WKV is a custom op with a shape-only ("fake") kernel, so where fla may run on
  the CPU (TRITON_INTERPRET=1 set before Python starts) it runs on FakeTensors in the
  model like any other op, and autograd keeps what the op saves (its inputs). Where it
  may not (a GPU machine), or for any implementation that cannot run on FakeTensors,
  it is measured alone on real tensors where it runs (the GPU, or the CPU under
  TRITON_INTERPRET=1), and the model measured with the chunked WKV gets each call's
  footprint swapped for the other implementation's (`WkvFootprint`, `_swap_wkv`).
  Temporaries inside a custom op's kernels are invisible either way (for fla a few
  copies of one layer's inputs, well inside the planner's `HEADROOM`).

Not modelled: allocator fragmentation, the CUDA context, NCCL and DALI workspaces.
The planner keeps `HEADROOM` of the device and `RESERVED_BYTES` for them;
benchmarks/gpu.py records the measured peak next to this model's prediction.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from src.errors import UserError
from src.open_alip import ClipLoss, get_model_config
from src.open_alip.wkv import resolve_wkv_impl, wkv
from src.perf.step_trace import (
    AUTOCAST_DTYPES,
    MEASURE_LOCK,
    TOWERS,
    LiveBytes,
    SavedBytes,
    StepRun,
    build_model,
    fake_mode,
    run_step,
    storage_key,
    tower_blocks,
)

# DALI keeps this many decoded batches on the GPU ahead of the trainer.
LOADER_PREFETCH = 3
PRECISIONS = ("bf16", "fp16", "fp32", "tf32")
# A training step's FLOPs over a forward pass's: forward 1, backward 2.
STEP_OVER_FORWARD = 3.0
# Blocks per tower in the measured model: block 0 differs from the others (ln0, no
# drop path); blocks 1, 2, ... are identical, so block 1 is what each further one adds.
_DEPTH = 2
# Batch sizes measured. Batch 1 is special: some reshapes of size-1 dimensions are
# views where larger batches copy, so it is not on the line through the others.
BATCHES = (2, 3)
# Batch sizes for a WKV measured with real tensors on a GPU: its first calls there are also
# the Triton autotuner's, whose choice is kept for the run (src/training/warmup.py), so they
# run at a batch near the real one rather than at 2.
GPU_WKV_BATCHES = (64, 96)


def wkv_batches(device: str, fake: bool) -> tuple[int, int]:
    return GPU_WKV_BATCHES if device == "cuda" and not fake else BATCHES


class CostModelError(UserError, ValueError):
    """Bad input to the cost model or a plan that cannot fit; the message says what to change."""


# --------------------------------------------------------------------------------------
# Lines in the batch size
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Linear:
    """Bytes (or FLOPs) as fixed + per_sample * batch."""

    fixed: float
    per_sample: float

    def at(self, batch: float) -> float:
        return self.fixed + self.per_sample * batch

    def __add__(self, other: Linear) -> Linear:
        return Linear(self.fixed + other.fixed, self.per_sample + other.per_sample)

    def __sub__(self, other: Linear) -> Linear:
        return Linear(self.fixed - other.fixed, self.per_sample - other.per_sample)

    def scaled(self, k: float) -> Linear:
        return Linear(self.fixed * k, self.per_sample * k)

    @classmethod
    def through(cls, at_first: float, at_second: float, batches: tuple[int, int] | None = None) -> Linear:
        """The line through the values measured at the two batch sizes (default BATCHES)."""
        b0, b1 = batches or BATCHES
        slope = (at_second - at_first) / (b1 - b0)
        return cls(at_first - slope * b0, slope)


def upper_envelope(lines: list[Linear]) -> tuple[Linear, ...]:
    """The lines that are the maximum for some batch >= 1, by increasing slope."""
    best: dict[float, float] = {}
    for line in lines:
        best[line.per_sample] = max(best.get(line.per_sample, float("-inf")), line.fixed)
    hull: list[Linear] = []
    for slope, fixed in sorted(best.items()):
        line = Linear(fixed, slope)
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is never above max(a, line) when line overtakes a no later than b does.
            if (line.fixed - a.fixed) * (b.per_sample - a.per_sample) >= (b.fixed - a.fixed) * (
                line.per_sample - a.per_sample
            ):
                hull.pop()
            else:
                break
        hull.append(line)
    while len(hull) >= 2 and hull[1].at(1) >= hull[0].at(1):
        hull.pop(0)  # wins only below batch 1
    return tuple(hull)


def _peak(lines: tuple[Linear, ...], batch: float) -> float:
    return max(line.at(batch) for line in lines)


def _timeline_lines(one: StepRun, two: StepRun) -> list[Linear]:
    if len(one.timeline) != len(two.timeline):
        raise RuntimeError(
            f"the training step ran {len(one.timeline)} ops at batch {BATCHES[0]} but {len(two.timeline)} at "
            f"batch {BATCHES[1]}; the cost model needs the same ops at every batch size"
        )
    return [Linear.through(a, b) for a, b in zip(one.timeline, two.timeline)]


# --------------------------------------------------------------------------------------
# The WKV: analytic FLOPs and per-call memory footprints
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WkvShape:
    tokens: int
    channels: int
    heads: int

    @property
    def head_size(self) -> int:
        return self.channels // self.heads


def wkv_flops(shape: WkvShape) -> float:
    """Forward FLOPs of one sample's bidirectional WKV in its recurrent form.

    Per token, head and direction: the read-out r^T S is N^2 multiply-adds (2 N^2) and
    the state update S * d + k v^T is 3 N^2, so two directions make 10 N^2; the bonus
    r . (u * k) v adds about 4 N. Backward counts as twice the forward.
    """
    n = shape.head_size
    return float(shape.tokens * shape.heads * (10 * n * n + 4 * n))


def analytic_flops(cfg: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The textbook count per sample, forward+backward, by tower and part.

    Matmul FLOPs are 2 * inputs * outputs per token, backward twice the forward, except
    the patch embedding (its input, the image, needs no gradient: backward once). Parts:
    "projections" (r, k, v, gate, output and the channel mix), "lora" (the data-dependent
    token-shift and decay LoRAs), "patch_embed", "wkv" (recurrent form, `wkv_flops`).
    """
    from src.open_alip.rwkv6 import DECAY_LORA, MIX_LORA

    out: dict[str, dict[str, float]] = {}
    for tower in TOWERS:
        shape, depth = tower_wkv_shape(cfg, tower), tower_depth(cfg, tower)
        if tower == "image":
            width, hidden = (
                int(cfg["image_embed_dims"]),
                int(cfg["image_embed_dims"]) * int(cfg["image_hidden_rate"]),
            )
            att = width
        else:
            width, hidden, att = int(cfg["n_embd"]), int(cfg["dim_ffn"]), int(cfg["dim_att"])
        tokens = shape.tokens
        projections = 4 * width * att + att * width + 2 * width * hidden + width * width
        lora = width * 5 * MIX_LORA + 5 * MIX_LORA * width + width * DECAY_LORA + DECAY_LORA * att
        parts = {
            "projections": STEP_OVER_FORWARD * 2 * tokens * projections * depth,
            "lora": STEP_OVER_FORWARD * 2 * tokens * lora * depth,
            "patch_embed": 0.0,
            "wkv": STEP_OVER_FORWARD * wkv_flops(shape) * depth,
        }
        if tower == "image":
            patch = int(cfg["image_patch_size"])
            parts["patch_embed"] = 2.0 * 2 * tokens * 3 * patch * patch * width
        out[tower] = parts
    return out


def tower_wkv_shape(cfg: Mapping[str, Any], tower: str) -> WkvShape:
    if tower == "image":
        grid = int(cfg["input_size"]) // int(cfg["image_patch_size"])
        return WkvShape(grid * grid, int(cfg["image_embed_dims"]), int(cfg["image_num_heads"]))
    dim_att, head = int(cfg["dim_att"]), int(cfg["head_size"])
    return WkvShape(int(cfg["ctx_len"]), dim_att, dim_att // head)


def tower_depth(cfg: Mapping[str, Any], tower: str) -> int:
    return int(cfg["image_depth"] if tower == "image" else cfg["n_layer"])


@dataclass(frozen=True)
class WkvFootprint:
    """One WKV call, per sample: bytes alive after forward (the output and what backward
    keeps), the peak over forward+backward, saved bytes, and the FLOPs the counter saw."""

    impl: str
    saved: float
    retained: float
    peak: float
    flops_counted: float
    measured_on: str

    @property
    def working(self) -> float:
        return self.peak - self.retained


def _wkv_run(impl: str, shape: WkvShape, batch: int, precision: str, device: str, fake: bool):
    # Outside the fake mode: a first use of fla imports it, and a module imported under
    # the fake mode would keep fake tensors. Raises when `impl` cannot run on `device`.
    resolve_wkv_impl(impl, device)
    act = AUTOCAST_DTYPES.get(precision, torch.float32)
    with fake_mode() if fake else contextlib.nullcontext():
        # Leaves stand in for the parameters upstream; they are not counted.
        base = [
            torch.randn(batch, shape.tokens, shape.channels, device=device, requires_grad=True)
            for _ in range(4)
        ]
        u = torch.randn(shape.heads, shape.head_size, device=device, requires_grad=True)
        exclude = {storage_key(t) for t in [*base, u]}
        live = LiveBytes(exclude)
        saved = SavedBytes(exclude, live)
        counter = FlopCounterMode(display=False)
        with counter, live:
            # As in the model: r, k, v leave bf16 linears under autocast, w is float32.
            # They are intermediates, alive after the call only if the WKV keeps them.
            r, k, v = ((t * 1).to(act) for t in base[:3])
            w = base[3] * 1
            with saved.hooks():
                y = wkv(r, k, v, w, u, impl=impl)
            del r, k, v, w
            retained, saved_bytes = live.current, sum(saved.by_tag().values())
            y.backward(torch.ones_like(y))
            del y
    return saved_bytes, retained, live.peak, counter.get_total_flops()


def _wkv_places() -> list[tuple[str, bool]]:
    """Where to try measuring a WKV implementation: FakeTensors, then real tensors."""
    places = [("cpu", True)]
    if torch.cuda.is_available():
        places.append(("cuda", False))
    return places + [("cpu", False)]


@functools.lru_cache(maxsize=64)
def wkv_footprint(impl: str, shape: WkvShape, precision: str = "bf16") -> WkvFootprint:
    """Per-sample footprint of one `wkv(..., impl=impl)` call at `shape` (from BATCHES).

    Raises RuntimeError saying what failed where when the implementation runs nowhere
    here (a Triton kernel on a machine without a GPU or TRITON_INTERPRET=1).
    """
    errors = []
    for device, fake in _wkv_places():
        try:
            batches = wkv_batches(device, fake)
            one, two = (_wkv_run(impl, shape, b, precision, device, fake) for b in batches)
        except Exception as exc:  # each place fails its own way: no fake kernel, no driver
            first = (str(exc).strip().splitlines() or [""])[0][:200]
            errors.append(f"{'fake ' if fake else ''}{device}: {type(exc).__name__}: {first}")
            continue
        saved, retained, peak, flops = (Linear.through(a, b, batches).per_sample for a, b in zip(one, two))
        where = f"{'FakeTensors' if fake else 'real tensors'} on {device}"
        return WkvFootprint(impl, saved, retained, peak, flops, where)
    raise CostModelError(
        f"wkv implementation {impl!r} could not be run to measure its memory ({'; '.join(errors)}); "
        "without a GPU, set TRITON_INTERPRET=1 before starting Python to run Triton kernels on the CPU"
    )


# --------------------------------------------------------------------------------------
# The cost model
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TowerCost:
    """One tower's cost per training sample; byte figures are lines in the batch size."""

    name: str
    layers: int
    wkv: WkvShape
    flops: float  # forward+backward model FLOPs per sample (matmuls + recurrent WKV)
    wkv_flops: float  # of which the WKV, all layers
    counted_wkv_flops: float  # matmul FLOPs the counter saw inside the measured WKV implementation
    saved: Linear  # saved for backward (saved-tensor hooks), no checkpointing
    retained: Linear  # alive after forward, no checkpointing
    retained_cp: Linear  # alive after forward, gradient checkpointing
    layer_retained: Linear  # what one more block adds to `retained`
    layer_retained_cp: Linear


@dataclass(frozen=True)
class CostModel:
    """Costs of training one model config with one WKV implementation and precision."""

    name: str
    config: dict[str, Any]
    wkv_impl: str
    precision: str
    device_type: str
    image: TowerCost
    text: TowerCost
    peak_lines: tuple[Linear, ...]  # activation peak of one forward+backward, no checkpointing
    peak_lines_cp: tuple[Linear, ...]  # the same with gradient checkpointing
    params: int
    param_bytes: int
    input_bytes: int  # one sample as the loader delivers it: float32 image, int64 tokens
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def towers(self) -> tuple[TowerCost, TowerCost]:
        return self.image, self.text

    @property
    def flops_per_sample(self) -> float:
        return self.image.flops + self.text.flops

    @property
    def wkv_flops_per_sample(self) -> float:
        return self.image.wkv_flops + self.text.wkv_flops

    @property
    def embed_dim(self) -> int:
        return int(self.config["n_embd"])

    @property
    def grad_bytes(self) -> int:
        return self.param_bytes

    @property
    def optimizer_bytes(self) -> int:
        return 2 * self.param_bytes  # AdamW's exp_avg and exp_avg_sq, in each parameter's dtype

    def activation_bytes(self, micro: int, checkpointing: bool) -> float:
        """Peak activation memory of one micro-batch's forward+backward (both towers)."""
        return _peak(self.peak_lines_cp if checkpointing else self.peak_lines, micro)

    def step_bytes(
        self, micro: int, accum: int, world_size: int, checkpointing: bool, bucket_view: bool = False
    ) -> dict[str, float]:
        """Predicted peak memory per GPU of one optimizer step, by part, and the total.

        `bucket_view`: DDP runs with gradient_as_bucket_view=True, so its gradient
        buckets are the gradients themselves rather than a second copy.
        """
        parts = {
            "parameters": float(self.param_bytes),
            "gradients": float(self.grad_bytes),
            "optimizer": float(self.optimizer_bytes),
            "ddp_buckets": float(self.grad_bytes if world_size > 1 and not bucket_view else 0),
            "activations": self.activation_bytes(micro, checkpointing),
            # Every rank computes the loss over the whole global batch.
            "loss": float(loss_peak_bytes(micro * accum * world_size, self.embed_dim)),
            "inputs": float(self.input_bytes * micro * (1 + LOADER_PREFETCH)),
            # Accumulation caches every micro-batch's embeddings (src/training/loop.py).
            "feature_cache": float(2 * micro * accum * self.embed_dim * 4 if accum > 1 else 0),
        }
        parts["total"] = sum(parts.values())
        return parts


@functools.lru_cache(maxsize=64)
def loss_peak_bytes(global_batch: int, embed_dim: int) -> int:
    """Peak bytes of ClipLoss forward+backward over a gathered global batch (float32)."""
    with fake_mode():
        base = [torch.randn(global_batch, embed_dim, requires_grad=True) for _ in range(2)]
        scale = torch.tensor(14.0, requires_grad=True)
        live = LiveBytes({storage_key(t) for t in [*base, scale]})
        with live:
            image, text = (t * 1 for t in base)
            loss = ClipLoss(world_size=1, rank=0)(image, text, scale)
            del image, text
            loss.backward()
            del loss
    return live.peak


def _resolve(config: str | Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    if isinstance(config, Mapping):
        return "custom", get_model_config(dict(config))
    return str(config), get_model_config(config)


def estimate_cost(
    config: str | Mapping[str, Any],
    wkv_impl: str = "chunked",
    precision: str | None = None,
    device_type: str = "cuda",
    wkv_apart: bool = False,
) -> CostModel:
    """Measure the costs of training `config` (once per process and arguments).

    `wkv_impl` is a name the model accepts; "auto" is resolved for `device_type` as the
    model resolves it (fla on CUDA when fla-core imports). `precision` defaults to the
    config's. `device_type` says whose autocast rules the activation memory follows:
    "cuda" to plan GPU runs, "cpu" for CPU runs. `wkv_apart` measures the WKV apart and
    swaps it in even when it could run inside the model (the method used for kernels
    that cannot; tests compare the two). Takes about ten seconds per config on one
    CPU core. Raises CostModelError for an unknown config, implementation or precision.
    """
    if device_type not in ("cuda", "cpu"):
        raise CostModelError(f"device_type {device_type!r}: use cuda or cpu")
    try:
        wkv_impl = resolve_wkv_impl(wkv_impl, device_type)
        name, cfg = _resolve(config)
    except (ValueError, FileNotFoundError) as exc:
        raise CostModelError(str(exc)) from None
    precision = precision or "bf16"  # the recipe's; model configs hold the architecture only
    if precision not in PRECISIONS:
        raise CostModelError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    with MEASURE_LOCK:
        return _estimate_cost(
            name, json.dumps(cfg, sort_keys=True), wkv_impl, precision, device_type, wkv_apart
        )


@functools.lru_cache(maxsize=32)
def _measure(config_json: str, impl: str, precision: str, device_type: str) -> CostModel:
    """The model measured running `impl` (named "custom"; `estimate_cost` names it)."""
    cfg = get_model_config(json.loads(config_json))
    small = get_model_config(dict(cfg), image_depth=_DEPTH, n_layer=_DEPTH)
    plain, cp = (
        {
            b: run_step(small, b, impl=impl, precision=precision, device_type=device_type, checkpointing=c)
            for b in BATCHES
        }
        for c in (False, True)
    )

    def line(runs: dict[int, StepRun], what: str, tags: list[str]) -> Linear:
        first, second = (sum(getattr(runs[b], what).get(t, 0) for t in tags) for b in BATCHES)
        return Linear.through(first, second)

    towers: dict[str, TowerCost] = {}
    shift, shift_cp = Linear(0, 0), Linear(0, 0)
    for tower in TOWERS:
        depth, shape = tower_depth(cfg, tower), tower_wkv_shape(cfg, tower)
        extra = depth - _DEPTH  # further blocks, each like block 1
        whole = [f"{tower}.rest"] + [f"{tower}.{i}" for i in range(_DEPTH)]
        block = [f"{tower}.1"]

        def full(runs: dict[int, StepRun], what: str, whole=whole, block=block, extra=extra) -> Linear:
            return line(runs, what, whole) + line(runs, what, block).scaled(extra)

        layer, layer_cp = line(plain, "retained", block), line(cp, "retained", block)
        counted = full(plain, "flops").per_sample
        inside = wkv_footprint(impl, shape, precision).flops_counted * depth
        analytic = STEP_OVER_FORWARD * wkv_flops(shape) * depth
        towers[tower] = TowerCost(
            name=tower,
            layers=depth,
            wkv=shape,
            flops=counted - inside + analytic,
            wkv_flops=analytic,
            counted_wkv_flops=inside,
            saved=full(plain, "saved"),
            retained=full(plain, "retained"),
            retained_cp=full(cp, "retained"),
            layer_retained=layer,
            layer_retained_cp=layer_cp,
        )
        # A further block adds its retained bytes to every point of the step: exact
        # until backward reaches it, an overestimate afterwards.
        shift += layer.scaled(extra)
        shift_cp += layer_cp.scaled(extra)

    notes = []
    if precision in AUTOCAST_DTYPES:
        notes.append(f"{precision} autocast as on {device_type.upper()}; the WKV and the loss in float32")
    params, param_bytes = _param_totals(small, cfg)
    size = int(cfg["input_size"])
    return CostModel(
        name="custom",
        config=cfg,
        wkv_impl=impl,
        precision=precision,
        device_type=device_type,
        image=towers["image"],
        text=towers["text"],
        peak_lines=upper_envelope([p + shift for p in _timeline_lines(*plain.values())]),
        peak_lines_cp=upper_envelope([p + shift_cp for p in _timeline_lines(*cp.values())]),
        params=params,
        param_bytes=param_bytes,
        input_bytes=3 * size * size * 4 + int(cfg["ctx_len"]) * 8,
        notes=tuple(notes),
    )


def _estimate_cost(
    name: str, config_json: str, wkv_impl: str, precision: str, device_type: str, wkv_apart: bool
) -> CostModel:
    cfg = get_model_config(json.loads(config_json))
    shapes = [tower_wkv_shape(cfg, tower) for tower in TOWERS]
    direct = not wkv_apart and all(
        wkv_footprint(wkv_impl, s, precision).measured_on.startswith("FakeTensors") for s in shapes
    )
    if direct:
        return replace(_measure(config_json, wkv_impl, precision, device_type), name=name)
    cost = _measure(config_json, "chunked", precision, device_type)
    towers, peak_lines, peak_lines_cp = _swap_wkv(
        dict(zip(TOWERS, cost.towers)), cost.peak_lines, cost.peak_lines_cp, wkv_impl, precision
    )
    where = wkv_footprint(wkv_impl, shapes[0], precision).measured_on
    return replace(
        cost,
        name=name,
        wkv_impl=wkv_impl,
        image=towers["image"],
        text=towers["text"],
        peak_lines=peak_lines,
        peak_lines_cp=peak_lines_cp,
        notes=(
            f"wkv {wkv_impl!r} measured alone on {where} and swapped into the chunked model's memory figures",
        )
        + cost.notes,
    )


def _swap_wkv(
    towers: dict[str, TowerCost],
    peak_lines: tuple[Linear, ...],
    peak_lines_cp: tuple[Linear, ...],
    impl: str,
    precision: str,
) -> tuple[dict[str, TowerCost], tuple[Linear, ...], tuple[Linear, ...]]:
    """The figures of a chunked-WKV model with every WKV call's footprint replaced.

    Without checkpointing every layer's retained WKV memory is alive when backward
    starts and one call's working set comes on top; with it, one block's at a time.
    A smaller working set or a smaller recomputed block is not credited (the peak may
    lie elsewhere), so the swap errs on the side of more memory.
    """
    swapped = {}
    shift, work, shift_cp = 0.0, 0.0, 0.0  # per sample
    for name, tower in towers.items():
        old, new = wkv_footprint("chunked", tower.wkv, precision), wkv_footprint(impl, tower.wkv, precision)
        d_saved, d_retained = new.saved - old.saved, new.retained - old.retained
        d_work = max(new.working - old.working, 0.0)
        swapped[name] = replace(
            tower,
            saved=tower.saved + Linear(0, d_saved * tower.layers),
            retained=tower.retained + Linear(0, d_retained * tower.layers),
            layer_retained=tower.layer_retained + Linear(0, d_retained),
        )
        shift += d_retained * tower.layers
        work = max(work, d_work)
        shift_cp = max(shift_cp, d_retained + d_work)
    lines = upper_envelope([p + Linear(0, shift + work) for p in peak_lines])
    lines_cp = upper_envelope([p + Linear(0, shift_cp) for p in peak_lines_cp])
    return swapped, lines, lines_cp


def _param_totals(small: Mapping[str, Any], cfg: Mapping[str, Any]) -> tuple[int, int]:
    """Parameter count and bytes of the full model, from the measured small one."""
    model = build_model(small, fake=True)
    count, nbytes = 0, 0
    for p in model.parameters():
        count, nbytes = count + p.numel(), nbytes + p.numel() * p.element_size()
    for tower in TOWERS:
        extra = tower_depth(cfg, tower) - _DEPTH
        for p in tower_blocks(model, tower)[1].parameters():
            count, nbytes = count + extra * p.numel(), nbytes + extra * p.numel() * p.element_size()
    return count, nbytes
