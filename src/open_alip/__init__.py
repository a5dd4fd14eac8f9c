"""The RWKV-CLIP library: tokenizer, model, loss, configs, zero-shot helpers, and open_clip's
entry points (`create_model_and_transforms`, `get_tokenizer`, `list_models`).

Two names, one library. Installed (`pip install .`, or `pip install -e .` for a checkout), it is
`open_alip`, importable from any folder: the name for users' code. Inside the repository the
toolkit (CLIs, training, evaluation, tests) and the how-to guide import it as `src.open_alip`.
Its modules import one another relatively, so either name works, but a process must use only
one: under both, every class exists twice and `isinstance` or `except` across them fails, which
is why importing the second one warns.

Names are resolved lazily so that `from open_alip import tokenize` does not build
model code, and so a data-conversion worker imports only what it uses.
"""

import sys
import warnings
from importlib import import_module

# Tells this library apart from an unrelated package that happens to share one of its names.
_LIBRARY = "rwkv-clip"
_NAMES = ("open_alip", "src.open_alip")

_EXPORTS = {
    "tokenize": "tokenizer",
    "tokenize_np": "tokenizer",
    "decode": "tokenizer",
    "SimpleTokenizer": "tokenizer",
    "create_model": "factory",
    "RWKV_CLIP": "model",
    "load_checkpoint": "model",
    "get_model_config": "model",
    "list_models": "model",
    "ClipLoss": "loss",
    "create_model_and_transforms": "factory",
    "create_model_from_pretrained": "factory",
    "list_pretrained": "released",
    "list_pretrained_tags_by_model": "released",
    "list_pretrained_models_by_tag": "released",
    "get_pretrained_cfg": "released",
    "register_pretrained": "released",
    "get_tokenizer": "factory",
    "load_pretrained": "pretrained",
    "load_rwkv_clip": "clip_benchmark_loader",
    "OpenAlipError": "errors",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # The lazily resolved names too, so that dir() and tab completion show the whole API at once.
    return sorted(set(globals()) | set(_EXPORTS))


def _warn_if_imported_twice() -> None:
    for name in _NAMES:
        other = sys.modules.get(name)
        if name != __name__ and other is not None and getattr(other, "_LIBRARY", None) == _LIBRARY:
            warnings.warn(
                f"the RWKV-CLIP library is imported as both {name!r} and {__name__!r}: each has its own "
                "classes, so isinstance checks and except clauses do not match across them; use one name "
                "per process: 'src.open_alip' alongside the toolkit's src.* modules, 'open_alip' otherwise",
                RuntimeWarning,
                stacklevel=2,
            )


_warn_if_imported_twice()
