"""Text tower of RWKV-CLIP: a bidirectional RWKV-6 over all ctx_len tokens.

Parameter names follow the released checkpoints (`text_model.*`): `emb`,
`blocks.N.{ln1,ln2,ln0,att,ffn}`, `ln_out`. The released weights store the per-layer
`time_decay` and `time_faaaa` in bfloat16; here they are float32 masters by default, cast
to the compute dtype in the forward pass (`set_decay_dtype` restores the original's
bfloat16 storage; `RWKV_CLIP.released_state_dict` gives the released layout).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .mix import fused_mixes
from .rwkv6 import TimeMix, channel_ramp, inference_path, layer_ratios, orthogonal_scaled_, shift_channels

TEXT_LINEAR_ORDER = ("receptance", "key", "value", "output", "gate")
DECAY_NAMES = ("time_decay", "time_faaaa")  # bfloat16 in the released checkpoints

# Scale of the orthogonal re-init per weight (by name suffix); unlisted 2-D weights get 1.
_TEXT_INIT_SCALE = {
    "att.key.weight": 0.1,
    "att.gate.weight": 0.1,
    "ffn.key.weight": 0.5,
    "att.output.weight": 0.0,
    "ffn.value.weight": 0.0,
    "ffn.receptance.weight": 0.0,
}


def bi_shift(x: torch.Tensor, head_size: int) -> torch.Tensor:
    """Per head: the first half of the channels from token t-1, the second from t+1 (zero fill)."""
    batch, time, channels = x.shape
    half = head_size // 2
    heads = x.reshape(batch, time, channels // head_size, head_size)
    moves = ((slice(0, half), 1, 1), (slice(half, head_size), 1, -1))
    return shift_channels(heads, moves).reshape(batch, time, channels)


class ChannelMix(nn.Module):
    """Squared-ReLU feed-forward; `time_maa_*` weight the shifted-minus-current difference."""

    def __init__(self, n_embd: int, dim_ffn: int, head_size: int):
        super().__init__()
        self.head_size = head_size
        self.mix_impl = "torch"  # "triton": fused (mix.py)
        self.time_maa_k = nn.Parameter(torch.zeros(1, 1, n_embd))
        self.time_maa_r = nn.Parameter(torch.zeros(1, 1, n_embd))
        self.key = nn.Linear(n_embd, dim_ffn, bias=False)
        self.receptance = nn.Linear(n_embd, n_embd, bias=False)
        self.value = nn.Linear(dim_ffn, n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mix_impl == "triton":
            xk, xr = fused_mixes(x, bi_shift(x, self.head_size), [self.time_maa_k, self.time_maa_r])
        elif inference_path(x):  # the mixes as one addcmul each, the activations in place
            xx = bi_shift(x, self.head_size) - x
            xk = torch.addcmul(x, xx, self.time_maa_k)
            xr = torch.addcmul(x, xx, self.time_maa_r)
            del xx
            k = self.key(xk).relu_()
            del xk
            v = self.value(k.mul_(k))
            del k  # the widest activation goes before the receptance's
            return v.mul_(self.receptance(xr).sigmoid_())
        else:
            xx = bi_shift(x, self.head_size) - x
            xk = x + xx * self.time_maa_k
            xr = x + xx * self.time_maa_r
        k = torch.relu(self.key(xk))
        # k * k, not square(): CUDA autocast runs pow in float32, a cast there and back.
        return torch.sigmoid(self.receptance(xr)) * self.value(k * k)


class Block(nn.Module):
    def __init__(
        self,
        layer_id: int,
        n_embd: int,
        dim_att: int,
        dim_ffn: int,
        head_size: int,
        head_size_divisor: int,
        dropout: float,
        with_cp: bool,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.head_size = head_size
        self.with_cp = with_cp
        self.ln1 = nn.LayerNorm(n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        if layer_id == 0:
            self.ln0 = nn.LayerNorm(n_embd)
        # Only the eps carries head_size_divisor; the WKV output is not divided by it.
        eps = 1e-5 * head_size_divisor**2
        self.att = TimeMix(n_embd, dim_att, dim_att // head_size, eps, TEXT_LINEAR_ORDER, cast_decays=True)
        self.ffn = ChannelMix(n_embd, dim_ffn, head_size)
        self.drop0 = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.drop1 = nn.Dropout(dropout) if dropout > 0 else nn.Identity()

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.layer_id == 0:
            x = self.ln0(x)
        h = self.ln1(x)
        x = self.drop0(x + self.att(h, bi_shift(h, self.head_size)))
        x = self.drop1(x + self.ffn(self.ln2(x)))
        return x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.with_cp and torch.is_grad_enabled():
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class TextRWKV(nn.Module):
    """`tokens [B, ctx_len] -> [B, n_embd]`: mean of the L2-normalised token features. The sizes are
    the model config's (model_configs/*.json, through model.py), their one owner."""

    def __init__(
        self,
        *,
        vocab_size: int,
        n_embd: int,
        dim_att: int,
        dim_ffn: int,
        n_layer: int,
        head_size: int,
        head_size_divisor: int,
        dropout: float = 0.0,
        with_cp: bool = False,
        text_initialization: bool = True,
    ):
        super().__init__()
        if n_embd % head_size or dim_att % head_size or head_size % 2:
            raise ValueError(
                f"n_embd {n_embd} and dim_att {dim_att} must be multiples of an even head_size {head_size}"
            )
        self.n_embd = n_embd
        self.emb = nn.Embedding(vocab_size, n_embd)
        self.blocks = nn.ModuleList(
            Block(i, n_embd, dim_att, dim_ffn, head_size, head_size_divisor, dropout, with_cp)
            for i in range(n_layer)
        )
        self.ln_out = nn.LayerNorm(n_embd)
        self.init_mixing()
        if text_initialization:
            self.reinit_weights()

    @torch.no_grad()
    def init_mixing(self) -> None:
        if self.emb.weight.is_meta:  # shapes only (check_fits, the cost model): nothing to fill
            return
        n_layer = len(self.blocks)
        for i, block in enumerate(self.blocks):
            block.att.init_mixing(i, n_layer, lora="text")
            _, r1 = layer_ratios(i, n_layer)
            ramp = 1.0 - channel_ramp(self.n_embd).pow(r1)
            block.ffn.time_maa_k.copy_(ramp)
            block.ffn.time_maa_r.copy_(ramp)

    @torch.no_grad()
    def reinit_weights(self) -> None:
        """The original `text_initialization`: orthogonal 2-D weights, small embedding, and
        every value rounded to bfloat16, as the released (bf16) runs initialised them."""
        if self.emb.weight.is_meta:  # shapes only (check_fits, the cost model): nothing to fill
            return
        n_layer = len(self.blocks)
        for name, p in self.named_parameters():
            if name == "emb.weight":
                p.uniform_(-1e-4, 1e-4)
            elif name.endswith("att.ln_x.weight"):
                layer = int(name.split(".")[1])
                p.fill_(((layer + 1) / n_layer) ** 0.7)
            elif p.dim() == 2 and ".time_" not in name:
                scale = next((s for suffix, s in _TEXT_INIT_SCALE.items() if name.endswith(suffix)), 1.0)
                orthogonal_scaled_(p, scale)
            p.copy_(p.to(torch.bfloat16))

    def decay_keys(self, prefix: str = "") -> list[str]:
        """State-dict keys of the per-layer decays (`time_decay`, `time_faaaa`)."""
        return [f"{prefix}blocks.{i}.att.{name}" for i in range(len(self.blocks)) for name in DECAY_NAMES]

    def set_decay_dtype(self, dtype: torch.dtype) -> None:
        """Store every layer's decays in `dtype` (see RWKV_CLIP.set_text_decay_dtype)."""
        for block in self.blocks:
            for name in DECAY_NAMES:
                param = getattr(block.att, name)
                param.data = param.data.to(dtype)

    def set_with_cp(self, enabled: bool) -> None:
        for block in self.blocks:
            block.with_cp = enabled

    def forward_features(self, tokens: torch.Tensor) -> torch.Tensor:
        """Per-token features `[B, T, n_embd]` after `ln_out` (not normalised)."""
        x = self.emb(tokens)
        for block in self.blocks:
            x = block(x)
        return self.ln_out(x)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        # Padding positions count too: the original averages all ctx_len unit vectors.
        return F.normalize(self.forward_features(tokens), dim=-1, eps=1e-12).mean(dim=1)
