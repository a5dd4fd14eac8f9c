"""An independent float64 RWKV-CLIP, written from docs/model.md for the tests.

Deliberately naive and shaped differently from the library: plain functions over a
state_dict, explicit loops over positions and heads, einsum over the formulas. It is
slow and only meant for tiny configs.
"""

import math

import torch

Tensor = torch.Tensor


def naive_wkv(r: Tensor, k: Tensor, v: Tensor, w: Tensor, u: Tensor) -> Tensor:
    """y_t = sum_s (r_t . decay(s,t) . k_s) v_s per head, straight from the pair formula.

    decay(s, t) is the product of d_l strictly between s and t, grown one factor at a
    time while s walks away from t; decay(t, t) is the bonus u.
    """
    batch, time, channels = r.shape
    heads, size = u.shape
    d = torch.exp(-torch.exp(w))
    y = torch.zeros(batch, time, channels, dtype=r.dtype)

    def add(t: int, s: int, factor: Tensor) -> None:
        weight = (r[:, t] * factor * k[:, s]).reshape(batch, heads, size).sum(-1)  # per head
        y[:, t] += (weight[:, :, None] * v[:, s].reshape(batch, heads, size)).reshape(batch, channels)

    for t in range(time):
        add(t, t, u.reshape(channels).expand(batch, channels))
        for direction in (-1, 1):
            factor = torch.ones(batch, channels, dtype=r.dtype)
            s = t + direction
            while 0 <= s < time:
                add(t, s, factor)
                factor = factor * d[:, s]  # s now lies between t and the next source
                s += direction
    return y


def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


def group_norm_per_token(y: Tensor, heads: int, weight: Tensor, bias: Tensor, eps: float) -> Tensor:
    out = torch.empty_like(y)
    size = y.shape[-1] // heads
    for h in range(heads):
        part = y[..., h * size : (h + 1) * size]
        mean = part.mean(-1, keepdim=True)
        var = ((part - mean) ** 2).mean(-1, keepdim=True)
        out[..., h * size : (h + 1) * size] = (part - mean) / torch.sqrt(var + eps)
    return out * weight + bias


def image_shift(x: Tensor, rows: int, cols: int, head_size: int) -> Tensor:
    """Token-by-token q-shift: quarters of each head from left, right, above, below."""
    batch, tokens, channels = x.shape
    q = head_size // 4
    out = torch.zeros_like(x)
    for i in range(rows):
        for j in range(cols):
            t = i * cols + j
            for c in range(channels):
                d = c % head_size
                if d < q:
                    src = (i, j - 1)
                elif d < 2 * q:
                    src = (i, j + 1)
                elif d < 3 * q:
                    src = (i - 1, j)
                else:
                    src = (i + 1, j)
                if 0 <= src[0] < rows and 0 <= src[1] < cols:
                    out[:, t, c] = x[:, src[0] * cols + src[1], c]
    return out


def text_shift(x: Tensor, head_size: int) -> Tensor:
    batch, time, channels = x.shape
    out = torch.zeros_like(x)
    for t in range(time):
        for c in range(channels):
            if c % head_size < head_size // 2:
                if t > 0:
                    out[:, t, c] = x[:, t - 1, c]
            elif t < time - 1:
                out[:, t, c] = x[:, t + 1, c]
    return out


def linear(x: Tensor, weight: Tensor) -> Tensor:
    return torch.einsum("...i,oi->...o", x, weight)


def time_mix(p: dict[str, Tensor], x: Tensor, shifted: Tensor, heads: int, eps: float) -> Tensor:
    xx = shifted - x
    xxx = x + xx * p["time_maa_x"]
    hidden = torch.tanh(torch.einsum("btc,cf->btf", xxx, p["time_maa_w1"]))
    mixed = {}
    for index, name in enumerate("wkvrg"):
        block = hidden[..., index * 32 : (index + 1) * 32]
        m = torch.einsum("btf,fc->btc", block, p["time_maa_w2"][index])
        mixed[name] = x + xx * (p[f"time_maa_{name}"] + m)
    r = linear(mixed["r"], p["receptance.weight"])
    k = linear(mixed["k"], p["key.weight"])
    v = linear(mixed["v"], p["value.weight"])
    gate_in = linear(mixed["g"], p["gate.weight"])
    g = gate_in / (1 + torch.exp(-gate_in))
    w = p["time_decay"] + torch.einsum(
        "btf,fc->btc",
        torch.tanh(torch.einsum("btc,cf->btf", mixed["w"], p["time_decay_w1"])),
        p["time_decay_w2"],
    )
    y = naive_wkv(r, k, v, w, p["time_faaaa"])
    y = group_norm_per_token(y, heads, p["ln_x.weight"], p["ln_x.bias"], eps)
    return linear(y * g, p["output.weight"])


def _ffn_core(p: dict[str, Tensor], xk: Tensor, xr: Tensor) -> Tensor:
    hidden = torch.clamp(linear(xk, p["key.weight"]), min=0) ** 2
    return 1 / (1 + torch.exp(-linear(xr, p["receptance.weight"]))) * linear(hidden, p["value.weight"])


def image_channel_mix(p: dict[str, Tensor], x: Tensor, shifted: Tensor) -> Tensor:
    xk = x * p["spatial_mix_k"] + shifted * (1 - p["spatial_mix_k"])
    xr = x * p["spatial_mix_r"] + shifted * (1 - p["spatial_mix_r"])
    return _ffn_core(p, xk, xr)


def text_channel_mix(p: dict[str, Tensor], x: Tensor, shifted: Tensor) -> Tensor:
    xk = x + (shifted - x) * p["time_maa_k"]
    xr = x + (shifted - x) * p["time_maa_r"]
    return _ffn_core(p, xk, xr)


def sub(state: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {k[len(prefix) :]: v.double() for k, v in state.items() if k.startswith(prefix)}


def image_features(state: dict[str, Tensor], images: Tensor, cfg: dict) -> Tensor:
    """Per-patch features after the final norm, `[B, H'*W', C]`."""
    p = sub(state, "image_model.")
    patch = cfg["image_patch_size"]
    weight, bias = p["patch_embed.projection.weight"], p["patch_embed.projection.bias"]
    batch, _, height, width = images.shape
    rows, cols = height // patch, width // patch
    tokens = []
    for i in range(rows):
        for j in range(cols):
            window = images[:, :, i * patch : (i + 1) * patch, j * patch : (j + 1) * patch]
            tokens.append(torch.einsum("bchw,ochw->bo", window, weight) + bias)
    x = torch.stack(tokens, dim=1)
    pos = p["pos_embed"]
    if pos.shape[1] != rows * cols:
        side = int(math.isqrt(pos.shape[1]))
        grid = pos.reshape(1, side, side, -1).permute(0, 3, 1, 2)
        grid = torch.nn.functional.interpolate(grid, size=(rows, cols), mode="bicubic", align_corners=False)
        pos = grid.permute(0, 2, 3, 1).reshape(1, rows * cols, -1)
    x = x + pos
    heads = cfg["image_num_heads"]
    head_size = x.shape[-1] // heads
    for layer in range(cfg["image_depth"]):
        q = sub(p, f"layers.{layer}.")
        if layer == 0:
            x = layer_norm(x, q["ln0.weight"], q["ln0.bias"])
        h = layer_norm(x, q["ln1.weight"], q["ln1.bias"])
        x = x + time_mix(sub(q, "att."), h, image_shift(h, rows, cols, head_size), heads, 1e-5)
        h = layer_norm(x, q["ln2.weight"], q["ln2.bias"])
        x = x + image_channel_mix(sub(q, "ffn."), h, image_shift(h, rows, cols, head_size))
    return layer_norm(x, p["ln1.weight"], p["ln1.bias"])


def text_features(state: dict[str, Tensor], tokens: Tensor, cfg: dict) -> Tensor:
    """Per-token features after ln_out, `[B, T, C]`."""
    p = sub(state, "text_model.")
    x = p["emb.weight"][tokens]
    head_size = cfg["head_size"]
    heads = cfg["n_embd"] // head_size
    eps = 1e-5 * cfg["head_size_divisor"] ** 2
    for layer in range(cfg["n_layer"]):
        q = sub(p, f"blocks.{layer}.")
        if layer == 0:
            x = layer_norm(x, q["ln0.weight"], q["ln0.bias"])
        h = layer_norm(x, q["ln1.weight"], q["ln1.bias"])
        x = x + time_mix(sub(q, "att."), h, text_shift(h, head_size), heads, eps)
        h = layer_norm(x, q["ln2.weight"], q["ln2.bias"])
        x = x + text_channel_mix(sub(q, "ffn."), h, text_shift(h, head_size))
    return layer_norm(x, p["ln_out.weight"], p["ln_out.bias"])


def clip_forward(state: dict[str, Tensor], images: Tensor, tokens: Tensor, cfg: dict):
    image = image_features(state, images, cfg).mean(1)
    text = text_features(state, tokens, cfg)
    norms = torch.sqrt((text**2).sum(-1, keepdim=True)).clamp(min=1e-12)
    text = (text / norms).mean(1)
    return image, text, torch.exp(state["logit_scale"].double())
