"""Image tower of RWKV-CLIP: a Vision-RWKV-6 backbone with mean pooling.

Parameter names follow the released checkpoints (`image_model.*`): `pos_embed`,
`patch_embed.projection`, `layers.N.{ln1,ln2,ln0,att,ffn}` and the final norm `ln1`
(the same name as each block's pre-attention norm, a different module).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from .mix import fused_mixes
from .rwkv6 import DropPath, TimeMix, channel_ramp, inference_path, layer_ratios, shift_channels

IMAGE_GN_EPS = 1e-5
IMAGE_LINEAR_ORDER = ("key", "value", "receptance", "gate", "output")


def q_shift(x: torch.Tensor, resolution: tuple[int, int], head_size: int) -> torch.Tensor:
    """Shift each head's channel quarters from the left, right, upper and lower patch.

    `x` is `[B, H'*W', C]` in row-major patch order; borders are filled with zeros.
    """
    batch, tokens, channels = x.shape
    rows, cols = resolution
    if rows * cols != tokens:
        raise ValueError(f"{tokens} tokens do not form a {rows}x{cols} patch grid")
    q = head_size // 4
    grid = x.reshape(batch, rows, cols, channels // head_size, head_size)
    moves = (
        (slice(0, q), 2, 1),  # from the left neighbour
        (slice(q, 2 * q), 2, -1),  # from the right
        (slice(2 * q, 3 * q), 1, 1),  # from above
        (slice(3 * q, head_size), 1, -1),  # from below
    )
    return shift_channels(grid, moves).reshape(batch, tokens, channels)


class PatchEmbed(nn.Module):
    def __init__(self, patch_size: int, embed_dims: int, in_channels: int = 3):
        super().__init__()
        self.projection = nn.Conv2d(in_channels, embed_dims, kernel_size=patch_size, stride=patch_size)

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        x = self.projection(images)
        resolution = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), resolution


class ChannelMix(nn.Module):
    """Squared-ReLU feed-forward; `spatial_mix_*` weight the unshifted input."""

    def __init__(self, embed_dims: int, num_heads: int, hidden_rate: int):
        super().__init__()
        hidden = hidden_rate * embed_dims
        self.head_size = embed_dims // num_heads
        self.mix_impl = "torch"  # "triton": fused (mix.py)
        self.spatial_mix_k = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.spatial_mix_r = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.key = nn.Linear(embed_dims, hidden, bias=False)
        self.receptance = nn.Linear(embed_dims, embed_dims, bias=False)
        self.value = nn.Linear(hidden, embed_dims, bias=False)

    def forward(self, x: torch.Tensor, resolution: tuple[int, int]) -> torch.Tensor:
        xs = q_shift(x, resolution, self.head_size)
        if self.mix_impl == "triton":  # x * mix + xs * (1 - mix) = xs + (x - xs) * mix
            xk, xr = fused_mixes(xs, x, [self.spatial_mix_k, self.spatial_mix_r])
        elif inference_path(x):  # the same mixes in three passes, the activations in place
            diff = x - xs
            xk = torch.addcmul(xs, diff, self.spatial_mix_k)
            xr = torch.addcmul(xs, diff, self.spatial_mix_r)
            del diff, xs
            k = self.key(xk).relu_()
            del xk
            v = self.value(k.mul_(k))
            del k  # the widest activation goes before the receptance's
            return v.mul_(self.receptance(xr).sigmoid_())
        else:
            xk = x * self.spatial_mix_k + xs * (1 - self.spatial_mix_k)
            xr = x * self.spatial_mix_r + xs * (1 - self.spatial_mix_r)
        k = torch.relu(self.key(xk))
        # k * k, not square(): CUDA autocast runs pow in float32, a cast there and back.
        return torch.sigmoid(self.receptance(xr)) * self.value(k * k)


class Block(nn.Module):
    def __init__(
        self,
        layer_id: int,
        embed_dims: int,
        num_heads: int,
        hidden_rate: int,
        drop_path: float,
        with_cp: bool,
    ):
        super().__init__()
        self.layer_id = layer_id
        self.with_cp = with_cp
        self.ln1 = nn.LayerNorm(embed_dims)
        self.ln2 = nn.LayerNorm(embed_dims)
        if layer_id == 0:
            self.ln0 = nn.LayerNorm(embed_dims)
        self.att = TimeMix(embed_dims, embed_dims, num_heads, IMAGE_GN_EPS, IMAGE_LINEAR_ORDER)
        self.ffn = ChannelMix(embed_dims, num_heads, hidden_rate)
        self.drop_path = DropPath(drop_path)

    def _forward(self, x: torch.Tensor, resolution: tuple[int, int]) -> torch.Tensor:
        if self.layer_id == 0:
            x = self.ln0(x)
        h = self.ln1(x)
        x = x + self.drop_path(self.att(h, q_shift(h, resolution, self.att.head_size)))
        x = x + self.drop_path(self.ffn(self.ln2(x), resolution))
        return x

    def forward(self, x: torch.Tensor, resolution: tuple[int, int]) -> torch.Tensor:
        if self.with_cp and torch.is_grad_enabled():
            return checkpoint(self._forward, x, resolution, use_reentrant=False)
        return self._forward(x, resolution)


def resize_pos_embed(pos_embed: torch.Tensor, src: tuple[int, int], dst: tuple[int, int]) -> torch.Tensor:
    """Bicubic resize of a `[1, H*W, C]` position table from grid `src` to grid `dst`."""
    if src == dst:
        return pos_embed
    channels = pos_embed.shape[-1]
    grid = pos_embed.reshape(1, src[0], src[1], channels).permute(0, 3, 1, 2)
    grid = F.interpolate(grid, size=dst, mode="bicubic", align_corners=False)
    return grid.permute(0, 2, 3, 1).reshape(1, dst[0] * dst[1], channels)


class VisionRWKV(nn.Module):
    """`images [B, 3, S, S] -> [B, embed_dims]`: mean of the final-normed patch features. The sizes
    are the model config's (model_configs/*.json, through model.py), their one owner."""

    def __init__(
        self,
        *,
        img_size: int,
        patch_size: int,
        embed_dims: int,
        depth: int,
        num_heads: int,
        hidden_rate: int,
        drop_path_rate: float = 0.0,
        with_cp: bool = False,
    ):
        super().__init__()
        if embed_dims % num_heads or (embed_dims // num_heads) % 4:
            raise ValueError(
                f"image_embed_dims {embed_dims} must split into {num_heads} heads whose size is a multiple "
                "of 4"
            )
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.patch_resolution = (img_size // patch_size, img_size // patch_size)
        tokens = self.patch_resolution[0] * self.patch_resolution[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, embed_dims))
        self.patch_embed = PatchEmbed(patch_size, embed_dims)
        rates = [drop_path_rate * i / (depth - 1) for i in range(depth)] if depth > 1 else [0.0]
        self.layers = nn.ModuleList(
            Block(i, embed_dims, num_heads, hidden_rate, rates[i], with_cp) for i in range(depth)
        )
        self.ln1 = nn.LayerNorm(embed_dims)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """Original from-scratch init; everything not listed keeps PyTorch's defaults."""
        if self.pos_embed.is_meta:  # shapes only (check_fits, the cost model): nothing to fill
            return
        self.pos_embed.zero_()
        depth = len(self.layers)
        for i, block in enumerate(self.layers):
            block.att.init_mixing(i, depth, lora="image")
            _, r1 = layer_ratios(i, depth)
            ramp = channel_ramp(self.embed_dims).pow(r1)
            block.ffn.spatial_mix_k.copy_(ramp)
            block.ffn.spatial_mix_r.copy_(ramp)

    def set_with_cp(self, enabled: bool) -> None:
        for block in self.layers:
            block.with_cp = enabled

    def forward_features(self, images: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Per-patch features `[B, H'*W', C]` after the final norm, and the grid."""
        x, resolution = self.patch_embed(images)
        x = x + resize_pos_embed(self.pos_embed, self.patch_resolution, resolution)
        for block in self.layers:
            x = block(x, resolution)
        return self.ln1(x), resolution

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features, _ = self.forward_features(images)
        return features.mean(dim=1)
