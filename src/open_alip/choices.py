"""The names of the model's interchangeable implementations, without importing them (no torch):
what train.py's parser offers as choices, checked against the implementations themselves
(`wkv.IMPLEMENTATIONS`, `mix.py`) when those are imported."""

# Every WKV that `wkv.wkv` runs by name, and "auto" (chosen per device by `resolve_wkv_impl`).
WKV_IMPLEMENTATIONS: tuple[str, ...] = ("chunked", "reference", "fla", "fla_chunk", "bi_triton")
WKV_IMPL_CHOICES: tuple[str, ...] = ("auto", *WKV_IMPLEMENTATIONS)
# The token-shift mixes: eager torch ops, or the fused Triton kernels (mix.py).
MIX_IMPLS: tuple[str, ...] = ("torch", "triton")
