"""A pickle reader for data files that must hold only plain data (the CIFAR batches).

`pickle.load` runs whatever callable a file names, so a crafted `batches.meta` can run a command.
CIFAR's pickles (written by Python 2's cPickle, or re-saved by Python 3) need no callable besides
numpy's array and dtype reconstructors: dicts, lists, tuples, strings, bytes and numbers are pickle
opcodes, not globals. `restricted_load` allows exactly those reconstructors and refuses any other
global with `ForbiddenGlobal` naming it; callers turn that into their own one-line error.
"""

from __future__ import annotations

import pickle
from typing import IO, Any

# (module, name) pairs a CIFAR pickle may name. numpy 1.x pickles say numpy.core, numpy 2.x numpy._core;
# protocol 5 pickles of contiguous arrays go through _frombuffer; Python 3 writes bytes at protocol 2
# as _codecs.encode(text, "latin1") (a string conversion, nothing more).
ALLOWED_GLOBALS = frozenset(
    (module, name)
    for core in ("numpy.core", "numpy._core")
    for module, name in (
        (f"{core}.multiarray", "_reconstruct"),
        (f"{core}.numeric", "_frombuffer"),
    )
) | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class ForbiddenGlobal(pickle.UnpicklingError):
    """The pickle names a callable outside ALLOWED_GLOBALS; nothing of it was run."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in ALLOWED_GLOBALS:
            raise ForbiddenGlobal(
                f"it asks for {module}.{name}, and only numpy arrays and plain containers are allowed"
            )
        return super().find_class(module, name)


def restricted_load(file: IO[bytes], encoding: str = "bytes") -> Any:
    """`pickle.load(file, encoding=encoding)` that builds only containers, scalars and numpy arrays.

    Raises ForbiddenGlobal (an UnpicklingError) for any other global; a truncated or garbled file
    raises what `pickle` raises for it (EOFError, UnpicklingError, ValueError, ...)."""
    return _RestrictedUnpickler(file, encoding=encoding).load()
