"""Where Triton kernels can run: CUDA tensors, or CPU tensors under Triton's interpreter.

Shared by the WKV bindings (`wkv_fla.py`, `wkv_bi_triton.py`). Triton decides whether a
kernel is interpreted when the module defining it is imported, so the bindings import
their kernels on first use and check here that the interpreter took effect.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch

_TRUTHY = ("1", "true", "on", "yes")  # the values Triton accepts for TRITON_INTERPRET


def constant_under_compile(fn: Callable) -> Callable:
    """`torch.compiler.assume_constant_result(fn)` without importing torch._dynamo.

    That decorator imports torch._dynamo (about 2.4 s) at the decorated module's import, and
    every process that builds a model (CLIs, torchrun ranks, DataLoader workers) paid it even
    when nothing is compiled. Its whole effect is the mark set here; tests/open_alip/test_wkv.py
    checks that the real decorator sets the same, so a torch that changes it fails there.
    """
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


def interpreter_requested() -> bool:
    """Whether TRITON_INTERPRET asks Triton to interpret kernels on the CPU."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in _TRUTHY


def is_interpreted(kernel: object) -> bool:
    """Whether a Triton kernel (possibly wrapped in autotuners and heuristics) is interpreted."""
    from triton.runtime.interpreter import InterpretedFunction

    while not isinstance(kernel, InterpretedFunction) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return isinstance(kernel, InterpretedFunction)


def kernel_problem(
    device_type: str, load_kernel: Callable[[], object], *, needs: str, package: str, module: str
) -> str | None:
    """Why the kernels that `load_kernel` imports (returning one of them) cannot run on `device_type`.

    `needs` names the packages to install, `package` the one whose import may break,
    `module` what may have been imported before TRITON_INTERPRET=1 was set.
    """
    if device_type not in ("cpu", "cuda"):
        return f"it runs on CUDA tensors (and on CPU under TRITON_INTERPRET=1), not on {device_type}"
    if device_type == "cpu" and not interpreter_requested():
        return (
            "it runs on CUDA tensors; for CPU tensors set TRITON_INTERPRET=1 in the environment "
            "before starting Python (Triton's interpreter: exact but slow, meant for checks)"
        )
    try:
        kernel = load_kernel()
    except ImportError as exc:
        return (
            f"it needs {needs} (run `make` or `python -m src.install`; triton comes with a CUDA build of "
            f"torch): {exc}"
        )
    except Exception as exc:  # a broken install (e.g. a triton that the package does not support)
        first_line = (str(exc).splitlines() or [""])[0]
        return f"{package} failed to import ({type(exc).__name__}: {first_line})"
    if device_type == "cpu" and not is_interpreted(kernel):
        return (
            f"{module} was imported before TRITON_INTERPRET=1 was set, so its kernels are not interpreted; "
            "set it in the environment before starting Python"
        )
    return None


def device_guard(t: torch.Tensor):
    # Triton launches on the current CUDA device; a tensor on another GPU needs it switched.
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()
