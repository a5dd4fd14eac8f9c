"""Memory traffic of one RWKV-CLIP training step: bytes read + written, by op class and source line.

    report = count_traffic("RWKV_CLIP_B32", batch=512, precision="bf16", wkv_impl="fla")
    report.per_pair("elementwise")         # bytes per training pair of that class
    report.top_lines(10)                   # the largest contributors, by model source line

A training step on a GPU is bound by memory traffic wherever it is not a matmul, and
traffic can be counted without a GPU. The step runs on FakeTensors (shape-only tensors:
the real autograd graph and autocast casts, no arithmetic) as src/perf/step_trace.py
runs it for the cost model, under CUDA autocast's rules (its float32 ops, e.g. pow), in
training mode: forward, the CLIP loss, backward, gradient clipping and a fused AdamW
step. A dispatch mode counts every aten op the eager step would launch:

* bytes read: every tensor input, counted as the elements it addresses (a broadcast
  dimension once); an input the op only overwrites (copy_, fill_, out=) is not read;
* bytes written: every new output, and every input the op mutates;
* views, `empty`, and shape arithmetic move no bytes.

Each op is counted once at its own size: what a fused kernel would keep in registers
is counted as written and read back, as eager mode does, and nothing is assumed to
stay in L2. A matmul counts its operands and result once (ideal tiling).

Classes: "matmul" (mm, bmm, convolution and their backward), "cast" (a dtype change),
"copy" (same-dtype copies: clone, cat, pad, flip, zero fills, slice_backward...),
"elementwise" (everything else the model runs: arithmetic, activations, norms,
reductions, the embedding gather, the loss), "wkv" and "optimizer" (clipping, AdamW).

The WKV: for implementations whose kernels are opaque (fla, bi_triton) the model runs
the chunked WKV on FakeTensors, every op inside `wkv()` (forward, and backward through
the autograd nodes it created) is left out, and each call adds its implementation's
traffic counted from the launch shapes (`WKV_TRAFFIC`, from
`src.open_alip.wkv.wkv_traffic_bytes`: for fla its float32 copies, flips, per-tile
partials and sums; for bi_triton its two passes over bf16 inputs). For "chunked" and
"reference", plain torch ops, the ops are counted at dispatch and classed "wkv".

The token-shift mixes: with `mix_impl="triton"` each mix site is one custom op
(`src/open_alip/mix.py`), counted at dispatch like any op: its inputs read and its
outputs written once, as its kernels do. The float32 partial sums of its coefficient
gradients (K x C floats per 256 rows, about 0.1% of the op) are not counted.

Backward ops are attributed to the forward line that created their autograd node
(anomaly mode records each node's forward stack). Not counted: the data loader, DDP's
gradient buckets and all-reduce, and torch.compile's fusion (this is the eager step).
"""

from __future__ import annotations

import functools
import re
import sys
import types
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from src.errors import UserError
from src.open_alip import ClipLoss, get_model_config
from src.open_alip import wkv as wkv_module
from src.open_alip.choices import MIX_IMPLS
from src.perf.step_trace import (
    MEASURE_LOCK,
    autocast,
    autocast_rules,
    build_model,
    fake_mode,
)

CLASSES = ("matmul", "elementwise", "cast", "copy", "wkv", "optimizer")
# H200 HBM3e bandwidth, bytes/s: the time a byte count takes at best.
H200_BANDWIDTH = 4.3e12
PRECISIONS = ("bf16", "fp16", "fp32")

_REPO = Path(__file__).resolve().parents[2]
# Frames never named as a site: this module, the step's driver, and the fused mixes' binding
# (its op is charged to the model line that asked for the mixes).
_HERE = {
    str(Path(__file__).resolve()),
    str(_REPO / "src" / "training" / "step_trace.py"),
    str(_REPO / "src" / "open_alip" / "mix.py"),
}
_WKV_FILE = str(Path(wkv_module.__file__).resolve())
_WKV_CODE = wkv_module.wkv.__code__

_MATMUL = {
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "matmul",
    "convolution", "convolution_backward", "_convolution",
}  # fmt: skip
_COPY = {
    "clone", "copy_", "cat", "stack", "flip", "constant_pad_nd", "slice_backward", "select_backward",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full", "full_like", "new_full",
    "fill_", "zero_", "roll", "repeat", "slice_scatter", "select_scatter", "as_strided_scatter",
    "diagonal_backward", "expand_copy", "index_put_", "index_put", "where",
}  # fmt: skip
# Ops that allocate without writing, or compute on shapes only.
_FREE = {
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
    "_local_scalar_dense",
    "sym_size",
    "sym_stride",
    "sym_numel",
    "sym_storage_offset",
    "is_same_size",
    "lift_fresh",
    "_unsafe_view",
    "_reshape_alias",
}
# Ops that overwrite their first argument without reading it.
_OVERWRITE = {"copy_", "fill_", "zero_"}


class TrafficError(UserError, ValueError):
    """Bad input to the traffic count; the message says what to change."""


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the elements `t` addresses: a broadcast (stride 0) dimension counts once."""
    if t.numel() == 0:
        return 0
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


def op_class(name: str, args: tuple, out: Any) -> str:
    """The class of aten op `name` (its packet name, e.g. "mul") as `count_traffic` reports it."""
    if name in _MATMUL:
        return "matmul"
    if name in ("_to_copy", "to", "copy_"):
        src = args[1] if name == "copy_" else args[0]
        dst = args[0] if name == "copy_" else out
        if isinstance(src, torch.Tensor) and isinstance(dst, torch.Tensor) and src.dtype != dst.dtype:
            return "cast"
        return "copy"
    if name in _COPY:
        return "copy"
    return "elementwise"


def _written_args(func) -> set[int]:
    """Positions of the arguments `func` writes into (in-place ops, out= arguments)."""
    return {
        i for i, a in enumerate(func._schema.arguments) if a.alias_info is not None and a.alias_info.is_write
    }


def _is_view(func) -> bool:
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def op_bytes(func, args: tuple, kwargs: dict, out: Any) -> tuple[int, int]:
    """(bytes read, bytes written) of one eager aten op."""
    name = func._overloadpacket.__name__
    if name in _FREE or _is_view(func):
        return 0, 0
    if name == "embedding":  # a gather: the rows it fetches, not the whole table
        return tensor_bytes(out) + tensor_bytes(args[1]), tensor_bytes(out)
    schema_args = func._schema.arguments
    written_pos = _written_args(func)
    read = written = 0
    mutated: set[int] = set()
    for i, a in enumerate(schema_args):
        value = args[i] if i < len(args) else kwargs.get(a.name)
        tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
        if i in written_pos:
            for t in tensors:
                written += tensor_bytes(t)
                mutated.add(t.untyped_storage()._cdata)
            if name in _OVERWRITE or a.kwarg_only:  # out= arguments are not read
                continue
        read += sum(tensor_bytes(t) for t in tensors)
    outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    if not outputs and not written_pos:  # a query (prim::device, is_contiguous, ...): no kernel
        return 0, 0
    for t in outputs:
        if t.untyped_storage()._cdata not in mutated:
            written += tensor_bytes(t)
    return read, written


@dataclass(frozen=True)
class WkvCall:
    """One `wkv()` call's launch shape and input dtypes."""

    tower: str
    batch: int
    time: int
    heads: int
    size: int
    dtype: torch.dtype  # r, k, v, u
    w_dtype: torch.dtype


def _analytic(impl: str) -> Callable[[WkvCall], dict[str, int]]:
    def count(call: WkvCall) -> dict[str, int]:
        return wkv_module.wkv_traffic_bytes(
            impl, call.batch, call.time, call.heads, call.size, dtype=call.dtype, w_dtype=call.w_dtype
        )

    return count


# impl -> its traffic from a call's launch shape, or None: its ops are counted at dispatch.
WKV_TRAFFIC: dict[str, Callable[[WkvCall], dict[str, int]] | None] = {
    "fla": _analytic("fla"),
    "bi_triton": _analytic("bi_triton"),
    "chunked": None,
    "reference": None,
}


@dataclass
class TrafficReport:
    """Bytes read + written by one training step of `batch` pairs, by class and source line."""

    config: str
    batch: int
    precision: str
    wkv_impl: str
    mix_impl: str = "torch"
    by_class: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CLASSES, 0))
    # (class, source line) -> bytes; backward ops carry their forward line
    by_line: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    by_op: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))  # (class, aten op)
    wkv_calls: list[WkvCall] = field(default_factory=list)
    wkv_parts: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # analytic parts, all calls

    @property
    def total(self) -> int:
        return sum(self.by_class.values())

    def per_pair(self, *classes: str) -> float:
        """Bytes per training pair of the given classes (all when none are given)."""
        return sum(self.by_class[c] for c in classes or CLASSES) / self.batch

    def seconds(self, *classes: str, bandwidth: float = H200_BANDWIDTH) -> float:
        """Time the step's bytes of these classes take at `bandwidth` bytes/s."""
        return self.per_pair(*classes) * self.batch / bandwidth

    def top_lines(self, n: int) -> list[tuple[str, str, int]]:
        """The n largest (class, source line, bytes) entries."""
        ranked = sorted(self.by_line.items(), key=lambda kv: -kv[1])[:n]
        return [(c, line, b) for (c, line), b in ranked]

    def as_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "batch": self.batch,
            "precision": self.precision,
            "wkv_impl": self.wkv_impl,
            "mix_impl": self.mix_impl,
            "bytes_per_pair": {c: self.per_pair(c) for c in CLASSES} | {"total": self.per_pair()},
            "top_lines": [
                {"class": c, "line": line, "bytes_per_pair": b / self.batch}
                for c, line, b in self.top_lines(40)
            ],
            "top_ops": [
                {"class": c, "op": op, "bytes_per_pair": b / self.batch}
                for (c, op), b in sorted(self.by_op.items(), key=lambda kv: -kv[1])[:40]
            ],
            "wkv_calls": [
                {
                    "tower": c.tower,
                    "batch": c.batch,
                    "time": c.time,
                    "heads": c.heads,
                    "size": c.size,
                    "dtype": str(c.dtype),
                    "w_dtype": str(c.w_dtype),
                }
                for c in self.wkv_calls
            ],  # fmt: skip
        }


_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


@functools.cache
def _resolved(path: str) -> str:
    # A backward node's stack names the same few files thousands of times; resolving is a syscall each.
    return str(Path(path).resolve())


@functools.cache
def _short(path: str) -> str | None:
    """`path` relative to the repository, or None for files outside it, this module's own, and
    installed packages (a virtual environment inside the repository, such as .venv, holds torch)."""
    if (
        path in _HERE
        or not path.startswith(str(_REPO))
        or path.startswith(sys.prefix)
        or "site-packages" in path
    ):
        return None
    return str(Path(path).relative_to(_REPO))


class TrafficCounter(TorchDispatchMode):
    """Adds every dispatched op's bytes to a TrafficReport.

    `phase` "optimizer" classes everything as optimizer traffic. In backward,
    `backward_site` (set by autograd node pre-hooks) gives the forward line and
    whether the node came from inside `wkv()`.
    """

    def __init__(self, report: TrafficReport, skip_wkv_ops: bool):
        super().__init__()
        self.report = report
        self.skip_wkv_ops = skip_wkv_ops
        self.phase = "forward"
        self.tower = ""
        self.backward_site: tuple[str, bool] = ("(autograd)", False)
        self.optimizer_site = "(optimizer)"
        self._wkv_frames: dict[int, types.FrameType] = {}
        self.on_wkv_call: Callable[[types.FrameType], None] | None = None

    def _forward_site(self) -> tuple[str, bool]:
        frame = sys._getframe(2)
        site, in_wkv = None, False
        while frame is not None:
            if frame.f_code is _WKV_CODE:
                in_wkv = True
                key = id(frame)
                if key not in self._wkv_frames:
                    self._wkv_frames[key] = frame
                    if self.on_wkv_call is not None:
                        self.on_wkv_call(frame)
            if site is None:
                short = _short(frame.f_code.co_filename)
                if short is not None:
                    site = f"{short}:{frame.f_lineno}"
            frame = frame.f_back
        return site or "(outside the repository)", in_wkv

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.phase == "optimizer":
            site, in_wkv = self.optimizer_site, False
        elif self.phase == "backward":
            site, in_wkv = self.backward_site
        else:
            site, in_wkv = self._forward_site()
        if in_wkv and self.skip_wkv_ops:
            return out
        read, written = op_bytes(func, args, kwargs, out)
        if read + written == 0:
            return out
        name = func._overloadpacket.__name__
        if self.phase == "optimizer":
            cls = "optimizer"
        elif in_wkv:
            cls = "wkv"
        else:
            cls = op_class(name, args, out)
        if self.phase == "backward":
            site = f"{site} (backward)"
        self.report.by_class[cls] += read + written
        self.report.by_line[(cls, site)] += read + written
        self.report.by_op[(cls, name)] += read + written
        return out


def _node_site(node) -> tuple[str, bool]:
    """The forward line that created autograd `node`, and whether it was inside `wkv()`."""
    stack = node.metadata.get("traceback_") if hasattr(node, "metadata") else None
    if not stack:
        return f"({type(node).__name__})", False
    site, in_wkv = None, False
    for entry in stack:  # outermost first
        m = _FRAME_RE.search(entry)
        if not m:
            continue
        path, line, fn = m.groups()
        if fn == "wkv" and _resolved(path) == _WKV_FILE:
            in_wkv = True
        short = _short(_resolved(path))
        if short is not None:
            site = f"{short}:{line}"
    return site or "(outside the repository)", in_wkv


def _hook_backward(roots: list[torch.Tensor], counter: TrafficCounter) -> list[Any]:
    """Pre-hooks that tell `counter` which forward line each backward node belongs to."""
    seen: dict[int, Any] = {}
    stack = [t.grad_fn for t in roots]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen[id(node)] = node
        site = _node_site(node)

        def enter(*_, site=site):
            counter.backward_site = site

        node.register_prehook(enter)
        stack.extend(n for n, _ in node.next_functions)
    return list(seen.values())


def _wkv_call_recorder(report: TrafficReport, counter: TrafficCounter) -> Callable[[types.FrameType], None]:
    def record(frame: types.FrameType) -> None:
        r, w, u = frame.f_locals["r"], frame.f_locals["w"], frame.f_locals["u"]
        heads, size = u.shape
        call = WkvCall(counter.tower, r.shape[0], r.shape[1], heads, size, r.dtype, w.dtype)
        report.wkv_calls.append(call)
        analytic = WKV_TRAFFIC.get(report.wkv_impl)
        if analytic is None:
            return
        parts = analytic(call)
        nbytes = sum(parts.values())
        report.by_class["wkv"] += nbytes
        report.by_line[("wkv", f"wkv {report.wkv_impl} kernels and their copies (analytic)")] += nbytes
        report.by_op[("wkv", f"{report.wkv_impl} (analytic)")] += nbytes
        for part, b in parts.items():
            report.wkv_parts[part] += b

    return record


def _iter_params(model: torch.nn.Module) -> Iterator[torch.nn.Parameter]:
    return (p for p in model.parameters() if p.requires_grad)


def count_traffic(
    config: str | Mapping[str, Any],
    batch: int,
    precision: str = "bf16",
    wkv_impl: str = "fla",
    grad_clip: bool = True,
    mix_impl: str = "torch",
) -> TrafficReport:
    """Count one eager training step's memory traffic (see the module docstring).

    About 20 s on one CPU core for B/32 at any batch (FakeTensors do no arithmetic).
    Raises TrafficError for an unknown config, precision or WKV implementation.
    """
    if precision not in PRECISIONS:
        raise TrafficError(f"precision {precision!r}: use one of {', '.join(PRECISIONS)}")
    if wkv_impl not in WKV_TRAFFIC:
        raise TrafficError(f"--wkv-impl {wkv_impl!r}: traffic is counted for {', '.join(WKV_TRAFFIC)}")
    if batch < 1:
        raise TrafficError(f"batch {batch}: use a positive number of pairs")
    if mix_impl not in MIX_IMPLS:
        raise TrafficError(f"--mix-impl {mix_impl!r}: use one of {', '.join(MIX_IMPLS)}")
    try:
        name = "custom" if isinstance(config, Mapping) else str(config)
        cfg = get_model_config(dict(config) if isinstance(config, Mapping) else config)
    except (ValueError, FileNotFoundError) as exc:
        raise TrafficError(str(exc)) from None
    report = TrafficReport(name, batch, precision, wkv_impl, mix_impl)
    # Opaque kernels are stood in for by the chunked WKV, whose ops are then left out.
    run_impl = "chunked" if WKV_TRAFFIC[wkv_impl] is not None else wkv_impl
    with MEASURE_LOCK:
        _run(cfg, batch, precision, run_impl, grad_clip, report)
    return report


def _run(
    cfg: Mapping[str, Any], batch: int, precision: str, run_impl: str, grad_clip: bool, report: TrafficReport
) -> None:
    model = build_model(cfg, fake=True)
    with fake_mode():
        model = model.to_empty(device="cpu")
        model.set_wkv_impl(run_impl)
        model.set_mix_impl(report.mix_impl)
        model.train()
        params = list(_iter_params(model))
        optimizer = torch.optim.AdamW(params, lr=1e-3, fused=True)
        # The optimizer's moments exist from the first step on: make them outside the count.
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss_fn = ClipLoss(world_size=1, rank=0)
        size = int(cfg["input_size"])
        images = torch.randn(batch, 3, size, size)
        tokens = torch.randint(0, int(cfg["vocab_size"]), (batch, int(cfg["ctx_len"])))
        counter = TrafficCounter(report, skip_wkv_ops=WKV_TRAFFIC[report.wkv_impl] is not None)
        counter.on_wkv_call = _wkv_call_recorder(report, counter)
        with counter, autocast_rules(precision, "cuda"):
            with torch.autograd.set_detect_anomaly(True, check_nan=False):
                with autocast(precision):
                    counter.tower = "image"
                    image_emb = model.encode_image(images)
                    counter.tower = "text"
                    text_emb = model.encode_text(tokens)
                    logit_scale = model.logit_scale.exp()
                counter.tower = ""
                loss = loss_fn(image_emb, text_emb, logit_scale)
            del image_emb, text_emb, logit_scale
            nodes = _hook_backward([loss], counter)
            counter.phase = "backward"
            loss.backward()
            del loss, nodes
            counter.phase = "optimizer"
            if grad_clip:
                counter.optimizer_site = "torch.nn.utils.clip_grad_norm_"
                torch.nn.utils.clip_grad_norm_(params, 1.0)
            counter.optimizer_site = "torch.optim.AdamW(fused=True).step"
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
