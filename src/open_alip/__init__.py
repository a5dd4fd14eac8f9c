"""The RWKV-CLIP library: tokenizer, model, loss, configs, zero-shot helpers, and open_clip's
entry points (`create_model_and_transforms`, `get_tokenizer`, `list_models`).

Names are resolved lazily so that `from src.open_alip import tokenize` does not build
model code, and so a data-conversion worker imports only what it uses.
"""

from importlib import import_module

_EXPORTS = {
    "tokenize": "tokenizer",
    "tokenize_np": "tokenizer",
    "decode": "tokenizer",
    "SimpleTokenizer": "tokenizer",
    "create_model": "model",
    "RWKV_CLIP": "model",
    "load_checkpoint": "model",
    "get_model_config": "model",
    "list_models": "model",
    "ClipLoss": "loss",
    "create_model_and_transforms": "factory",
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
