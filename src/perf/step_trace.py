"""One RWKV-CLIP training step run to be measured, not computed: live and saved bytes, FLOPs.

The model runs forward and backward on FakeTensors (torch's shape-only tensors: the real
autograd graph and autocast casts, no arithmetic), in training mode, under bf16/fp16
autocast when the precision asks for it, as the trainer runs it. A dispatch mode adds
every storage the ops create and a weakref finaliser removes it when it dies
(`LiveBytes`): that gives the bytes alive after the forward pass, the live total after
every op, and FLOPs by torch's FlopCounterMode formulas; saved-tensor hooks give the
bytes autograd saves for backward (`SavedBytes`). CUDA autocast's float32 ops can be
imitated on the CPU (`cuda_autocast_rules`). src/perf/cost_model.py turns these
measurements into costs per sample.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections import defaultdict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.flop_counter import flop_registry

from src.open_alip import create_model
from src.open_alip.wkv import resolve_wkv_impl

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
TOWERS = ("image", "text")


def storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created under it that are still alive, by tag.

    Each storage an op returns is counted once (views and in-place results share it)
    and a weakref finaliser on the storage uncounts it when it is freed, so after every
    op `current` is exact and `timeline` records it. `tag` labels new storages (which
    tower's forward made them). Storages in `exclude` (parameters, gradients) are
    never counted.
    """

    def __init__(self, exclude: set[int]):
        super().__init__()
        self.exclude = exclude
        self.tag = ""
        self.current = 0
        self.by_tag: dict[str, int] = defaultdict(int)
        self.flops: dict[str, int] = defaultdict(int)  # by the tag current when the op ran
        self.timeline: list[int] = []
        self._tracked: dict[int, tuple[int, str]] = {}

    def _forget(self, key: int) -> None:
        nbytes, tag = self._tracked.pop(key)
        self.current -= nbytes
        self.by_tag[tag] -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        count = flop_registry.get(func._overloadpacket)
        if count is not None:  # FlopCounterMode's formulas
            self.flops[self.tag] += count(*args, **kwargs, out_val=out)
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self.exclude or key in self._tracked:
                continue
            nbytes = storage.nbytes()
            self._tracked[key] = (nbytes, self.tag)
            self.current += nbytes
            self.by_tag[self.tag] += nbytes
            # Storage Python objects are preserved while the storage lives, so this
            # fires exactly when the memory is released.
            weakref.finalize(storage, self._forget, key).atexit = False
        self.timeline.append(self.current)
        return out

    @property
    def peak(self) -> int:
        return max(self.timeline, default=0)


class SavedBytes:
    """Bytes of the distinct storages autograd saved for backward that are still alive,
    by the tracker's tag when they were saved."""

    def __init__(self, exclude: set[int], live: LiveBytes):
        self.exclude = exclude
        self.live = live
        self.storages: dict[int, tuple[int, str]] = {}

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = storage._cdata
        if key not in self.exclude and key not in self.storages:
            self.storages[key] = (storage.nbytes(), self.live.tag)
            # A graph branch nobody uses frees what it saved; its address may come back.
            weakref.finalize(storage, self.storages.pop, key, None).atexit = False
        return t

    def by_tag(self) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for nbytes, tag in self.storages.values():
            out[tag] += nbytes
        return dict(out)

    def hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self.pack, lambda t: t)


# Ops CUDA autocast runs in float32 that CPU autocast leaves in the input's dtype (the
# op lists in the torch.amp documentation; the CPU list's own float32 ops are left
# alone). The model calls one of them on bf16 tensors: pow, through torch.square in
# both channel mixes; the others receive float32 already.
_CUDA_FP32_OPS = (
    "pow.Tensor_Scalar",
    "pow.Tensor_Tensor",
    "pow.Scalar",
    "exp",
    "expm1",
    "log",
    "log1p",
    "rsqrt",
    "reciprocal",
    "softplus",
    "layer_norm",
    "group_norm",
    "softmax.int",
    "log_softmax.int",
    "logsumexp",
    "sum",
    "sum.dim_IntList",
    "cumsum",
    "linalg_vector_norm",
)
_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)
# The CUDA autocast rules are registered process-wide while a measurement runs.
MEASURE_LOCK = threading.Lock()


def _widen(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float16):
        return x.float()
    return x


def _fp32_kernel(op):
    def kernel(*args, **kwargs):
        # What autocast does: cast with the autocast key excluded, above autograd, so
        # the cast is in the graph and backward saves the float32 copy.
        with torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU):
            args, kwargs = tree_map(_widen, (args, kwargs))
            return op(*args, **kwargs)

    return kernel


@contextlib.contextmanager
def cuda_autocast_rules() -> Iterator[None]:
    """While open, CPU autocast also runs CUDA autocast's float32 ops in float32.

    Registered as dispatcher kernels, not as a Python mode, because the autograd
    engine's checkpoint recomputation must see them too; removed on exit.
    """
    lib = torch.library.Library("aten", "IMPL")
    try:
        for name in _CUDA_FP32_OPS:
            packet, _, overload = name.partition(".")
            op = getattr(getattr(torch.ops.aten, packet), overload or "default")
            lib.impl(name, _fp32_kernel(op), "AutocastCPU")
        yield
    finally:
        lib._destroy()


@contextlib.contextmanager
def fake_mode() -> Iterator[Any]:
    from torch._subclasses.fake_tensor import FakeTensorMode

    # Non-fake inputs are allowed so that meta-built parameters can be materialised.
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        yield mode


def autocast(precision: str):
    dtype = AUTOCAST_DTYPES.get(precision)
    return torch.autocast("cpu", dtype=dtype) if dtype is not None else contextlib.nullcontext()


def autocast_rules(precision: str, device_type: str):
    if device_type == "cuda" and precision in AUTOCAST_DTYPES:
        return cuda_autocast_rules()
    return contextlib.nullcontext()


def build_model(cfg: Mapping[str, Any], fake: bool) -> torch.nn.Module:
    """A model to measure: on the meta device for FakeTensors (built outside the fake
    mode; `_ready` materialises it inside), else a real CPU model."""
    if fake:
        with torch.device("meta"):
            return create_model(dict(cfg))
    return create_model(dict(cfg))


def _ready(model: torch.nn.Module, fake: bool, impl: str, checkpointing: bool) -> torch.nn.Module:
    """In training mode with every gradient allocated, on (fake) CPU tensors.

    Pre-allocated gradients make backward accumulate in place, so gradient memory
    (counted apart) does not show up as activation memory.
    """
    if fake:
        model = model.to_empty(device="cpu")
    model.set_wkv_impl(impl)
    model.set_grad_checkpointing(checkpointing)
    model.train()
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    return model


def _param_storages(model: torch.nn.Module) -> set[int]:
    keys = {storage_key(p) for p in model.parameters()}
    return keys | {storage_key(p.grad) for p in model.parameters() if p.grad is not None}


def _images(cfg: Mapping[str, Any], batch: int) -> torch.Tensor:
    size = int(cfg["input_size"])
    return torch.randn(batch, 3, size, size)


def _tokens(cfg: Mapping[str, Any], batch: int) -> torch.Tensor:
    return torch.randint(0, int(cfg["vocab_size"]), (batch, int(cfg["ctx_len"])))


@dataclass(frozen=True)
class StepRun:
    """One measured forward+backward. Tags are "<tower>.<block>" and "<tower>.rest"."""

    saved: dict[str, int]  # saved for backward, by tag
    retained: dict[str, int]  # alive when the forward pass ends, by tag
    flops: dict[str, int]  # forward and backward, by tag
    timeline: tuple[int, ...]  # live bytes after every op of forward+backward


def tower_blocks(model: torch.nn.Module, tower: str) -> torch.nn.ModuleList:
    return model.image_model.layers if tower == "image" else model.text_model.blocks


def _tag_backward(root: torch.Tensor, stop: Any, tag: str, live: LiveBytes, tagged: dict[int, Any]) -> None:
    """Make the backward of the graph nodes between `root` and `stop` run under `tag`.

    Nodes tagged by an earlier call (in `tagged`) keep their tag: walking the blocks
    first and then each whole tower leaves "<tower>.rest" for what no block made.
    """

    def enter(*_):
        live.tag = tag

    visited: dict[int, Any] = {}  # holding the nodes keeps their ids unique
    stack = [root.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node is stop or id(node) in visited:
            continue
        visited[id(node)] = node
        if id(node) not in tagged:
            tagged[id(node)] = node
            node.register_prehook(enter)
        stack.extend(next_node for next_node, _ in node.next_functions)


def run_step(
    cfg: Mapping[str, Any],
    batch: int,
    *,
    impl: str,
    precision: str,
    device_type: str,
    checkpointing: bool,
    fake: bool = True,
) -> StepRun:
    """Forward and backward of both towers, as the trainer runs them.

    The loss here is a plain product of the embeddings: ClipLoss works on the global
    batch, not the micro-batch, and is measured apart (`loss_peak_bytes`).
    """
    resolve_wkv_impl(impl, "cpu")  # imports fla, if it is that, outside the fake mode
    model = build_model(cfg, fake)
    with fake_mode() if fake else contextlib.nullcontext():
        model = _ready(model, fake, impl, checkpointing)
        exclude = _param_storages(model)
        live = LiveBytes(exclude)
        saved = SavedBytes(exclude, live)
        ends: dict[str, tuple[Any, torch.Tensor]] = {}  # tag -> (input's grad_fn, output)
        handles = []
        for tower in TOWERS:
            for i, block in enumerate(tower_blocks(model, tower)):
                tag = f"{tower}.{i}"

                def before(module, args, tag=tag):
                    live.tag = tag
                    ends[tag] = (args[0].grad_fn, None)

                def after(module, args, output, tag=tag, tower=tower):
                    ends[tag] = (ends[tag][0], output)
                    live.tag = f"{tower}.rest"

                handles += [block.register_forward_pre_hook(before), block.register_forward_hook(after)]
        outputs = {}
        with live, autocast_rules(precision, device_type):
            # The order of the model's forward: image tower, then text tower.
            live.tag = "image.rest"
            images = _images(cfg, batch)
            with saved.hooks(), autocast(precision):
                outputs["image"] = model.encode_image(images)
            live.tag = "text.rest"
            tokens = _tokens(cfg, batch)
            with saved.hooks(), autocast(precision):
                outputs["text"] = model.encode_text(tokens)
            del images, tokens  # the batch stays alive only through what the graph saved
            retained, saved_now = dict(live.by_tag), saved.by_tag()
            tagged: dict[int, Any] = {}
            for tag, (stop, output) in ends.items():
                _tag_backward(output, stop, tag, live, tagged)
            for tower, output in outputs.items():
                _tag_backward(output, None, f"{tower}.rest", live, tagged)
            del tagged
            ends.clear()
            live.tag = "step"
            loss = (outputs["image"].float() * outputs["text"].float()).sum()
            outputs.clear()
            loss.backward()
            del loss
        for handle in handles:
            handle.remove()
    return StepRun(saved=saved_now, retained=retained, flops=dict(live.flops), timeline=tuple(live.timeline))
