"""Pieces shared by the image and text towers: the RWKV-6 time mix and drop path.

The two towers differ only in their token shift, the GroupNorm eps, the order in which
the projections are registered (it fixes the checkpoint key order) and the LoRA
initialisation; all of that is passed in.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .mix import fused_mixes
from .wkv import wkv

MIX_LORA = 32  # rank of the data-dependent token-shift LoRA (5 blocks: w, k, v, r, g)
DECAY_LORA = 64  # rank of the data-dependent decay LoRA


def layer_ratios(layer_id: int, n_layer: int) -> tuple[float, float]:
    """(r0, r1) = (l / (L-1), 1 - l / L); a one-layer tower gets r0 = 0 instead of 0/0."""
    r0 = layer_id / (n_layer - 1) if n_layer > 1 else 0.0
    return r0, 1.0 - layer_id / n_layer


def channel_ramp(channels: int) -> torch.Tensor:
    """ddd_c = c / C as `[1, 1, C]`."""
    return (torch.arange(channels, dtype=torch.float64) / channels).reshape(1, 1, channels)


# A move: (channel slice of the last dim, the token dim it shifts along, +1 from the
# previous token, -1 from the next). Shifted-out borders are zero.
Move = tuple[slice, int, int]


def _apply_moves(x: torch.Tensor, moves: tuple[Move, ...], sign: int) -> torch.Tensor:
    """One pass: each channel slice copied once from its neighbour, borders zeroed."""
    out = torch.empty_like(x)
    for channels, dim, step in moves:
        step *= sign
        n = x.shape[dim]
        src = x[..., channels].narrow(dim, 0 if step > 0 else 1, n - 1)
        dst = out[..., channels]
        dst.narrow(dim, 1 if step > 0 else 0, n - 1).copy_(src)
        dst.narrow(dim, 0 if step > 0 else n - 1, 1).zero_()
    return out


class _Shift(torch.autograd.Function):
    """A token shift whose backward is the opposite shift.

    Autograd through zeros + slice assignment (or pad + cat) writes a full-size
    gradient per channel slice and sums them; this writes each gradient once, with
    the same values (a shift only copies).
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor, moves: tuple[Move, ...]) -> torch.Tensor:
        ctx.moves = moves
        return _apply_moves(x, moves, 1)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return _Shift.apply(grad, tuple((c, d, -s) for c, d, s in ctx.moves)), None


def shift_channels(x: torch.Tensor, moves: tuple[Move, ...]) -> torch.Tensor:
    """Shift each channel slice of `x` (channels last) one token along its dim, zero-filled."""
    return _Shift.apply(x, moves)


def inference_path(x: torch.Tensor) -> bool:
    """Whether a block may take its forward-only path for `x`: no gradient is being recorded and no
    autocast region is open (the fewer, fused and in-place passes round like the plain path only in
    the weights' own dtype). Evaluation under `torch.no_grad()` / `torch.inference_mode()` takes it."""
    if torch.is_grad_enabled():
        return False
    try:
        return not torch.is_autocast_enabled(x.device.type)
    except RuntimeError:  # a device type without autocast (meta)
        return True


class DropPath(nn.Module):
    """Stochastic depth: drops a sample's whole residual branch while training."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


class TimeMix(nn.Module):
    """RWKV-6 attention with bidirectional WKV; the caller supplies the shifted input."""

    def __init__(
        self,
        n_embd: int,
        dim_att: int,
        n_head: int,
        gn_eps: float,
        linear_order: tuple[str, ...],
        wkv_impl: str = "auto",
        cast_decays: bool = False,
    ):
        super().__init__()
        if dim_att % n_head:
            raise ValueError(f"attention width {dim_att} is not divisible by {n_head} heads")
        self.n_head = n_head
        self.head_size = dim_att // n_head
        self.wkv_impl = wkv_impl
        self.mix_impl = "torch"  # "triton": the token-shift mixes fused (mix.py; RWKV_CLIP.set_mix_impl)
        # The text tower's decays: float32 masters used in the compute dtype, as the original's
        # bfloat16-stored ones are (text_rwkv.py).
        self.cast_decays = cast_decays
        for name in ("x", "w", "k", "v", "r", "g"):
            setattr(self, f"time_maa_{name}", nn.Parameter(torch.zeros(1, 1, n_embd)))
        self.time_maa_w1 = nn.Parameter(torch.zeros(n_embd, MIX_LORA * 5))
        self.time_maa_w2 = nn.Parameter(torch.zeros(5, MIX_LORA, n_embd))
        self.time_decay = nn.Parameter(torch.zeros(1, 1, dim_att))
        self.time_decay_w1 = nn.Parameter(torch.zeros(n_embd, DECAY_LORA))
        self.time_decay_w2 = nn.Parameter(torch.zeros(DECAY_LORA, dim_att))
        self.time_faaaa = nn.Parameter(torch.zeros(n_head, self.head_size))
        shapes = {
            "receptance": (n_embd, dim_att),
            "key": (n_embd, dim_att),
            "value": (n_embd, dim_att),
            "gate": (n_embd, dim_att),
            "output": (dim_att, n_embd),
        }
        if sorted(linear_order) != sorted(shapes):
            raise ValueError(f"linear_order must name each of {sorted(shapes)} once")
        for name in linear_order:
            fan_in, fan_out = shapes[name]
            setattr(self, name, nn.Linear(fan_in, fan_out, bias=False))
        self.ln_x = nn.GroupNorm(n_head, dim_att, eps=gn_eps)

    @torch.no_grad()
    def init_mixing(self, layer_id: int, n_layer: int, lora: str) -> None:
        """The original initialisation of the mixing, decay and bonus parameters.

        lora="image": all four LoRA matrices U(+-1e-4); lora="text": the first
        factors zero and the second U(+-0.01).
        """
        r0, r1 = layer_ratios(layer_id, n_layer)
        ddd = channel_ramp(self.time_maa_x.shape[-1])
        for name in ("x", "w", "k"):
            getattr(self, f"time_maa_{name}").copy_(1.0 - ddd.pow(r1))
        self.time_maa_v.copy_(1.0 - (ddd.pow(r1) + 0.3 * r0))
        self.time_maa_r.copy_(1.0 - ddd.pow(0.5 * r1))
        self.time_maa_g.copy_(1.0 - ddd.pow(0.5 * r1))

        dim_att = self.time_decay.shape[-1]
        n = torch.arange(dim_att, dtype=torch.float64)
        frac = n / max(dim_att - 1, 1)
        self.time_decay.copy_((-6.0 + 5.0 * frac.pow(0.7 + 1.3 * r0)).reshape(1, 1, dim_att))
        zigzag = torch.remainder(n + 1, 3) - 1
        self.time_faaaa.copy_((r0 * (1.0 - frac) + 0.1 * zigzag).reshape(self.time_faaaa.shape))

        if lora == "image":
            for p in (self.time_maa_w1, self.time_maa_w2, self.time_decay_w1, self.time_decay_w2):
                p.uniform_(-1e-4, 1e-4)
        elif lora == "text":
            self.time_maa_w1.zero_()
            self.time_decay_w1.zero_()
            self.time_maa_w2.uniform_(-0.01, 0.01)
            self.time_decay_w2.uniform_(-0.01, 0.01)
        else:
            raise ValueError(f"unknown LoRA init {lora!r}")

    def _mixes(self, x: torch.Tensor, x_shifted: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The five inputs (w, k, v, r, g) of the projections: token-shift mixes whose
        coefficients have a data-dependent LoRA term."""
        batch, time, _ = x.shape
        maa = (self.time_maa_w, self.time_maa_k, self.time_maa_v, self.time_maa_r, self.time_maa_g)
        fused = self.mix_impl == "triton"
        if fused:
            (xxx,) = fused_mixes(x, x_shifted, [self.time_maa_x])
        else:
            xx = x_shifted - x
            xxx = x + xx * self.time_maa_x
        lora = torch.tanh(xxx @ self.time_maa_w1).reshape(batch * time, 5, MIX_LORA).transpose(0, 1)
        m = (lora @ self.time_maa_w2).reshape(5, batch, time, -1)
        if fused:
            return fused_mixes(x, x_shifted, list(maa), m)
        # The five mixes as one broadcast: the same values as five, and backward sums the
        # gradients of x and xx in one reduction each instead of four accumulating adds.
        return (x + xx * (torch.stack(maa) + m)).unbind(0)

    def _mixes_inference(self, x: torch.Tensor, x_shifted: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """`_mixes` in three passes over the five mixes instead of stack, add, multiply and add:
        the LoRA matmul adds maa_f as it writes m_f, and one addcmul makes x + xx * (maa_f + m_f)."""
        batch, time, channels = x.shape
        rows = batch * time
        xx = x_shifted - x
        xxx = torch.addcmul(x, xx, self.time_maa_x)
        lora = torch.tanh(xxx.view(rows, channels) @ self.time_maa_w1).view(rows, 5, MIX_LORA).transpose(0, 1)
        maa = torch.stack(
            [self.time_maa_w, self.time_maa_k, self.time_maa_v, self.time_maa_r, self.time_maa_g]
        )
        coef = torch.baddbmm(maa.view(5, 1, channels), lora, self.time_maa_w2)  # maa_f + m_f
        mixes = torch.addcmul(x.view(1, rows, channels), xx.view(1, rows, channels), coef)
        return mixes.view(5, batch, time, channels).unbind(0)

    def _forward_inference(self, x: torch.Tensor, x_shifted: torch.Tensor) -> torch.Tensor:
        """`forward` without autograd: the same values, with the element-wise work fused (the mixes,
        the decay's bias inside its matmul) or done in place (SiLU, the gate)."""
        batch, time, channels = x.shape
        xw, xk, xv, xr, xg = self._mixes_inference(x, x_shifted)
        r = self.receptance(xr)
        k = self.key(xk)
        v = self.value(xv)
        g = F.silu(self.gate(xg), inplace=True)
        lora = torch.tanh(xw.reshape(batch * time, channels) @ self.time_decay_w1)
        del xw, xk, xv, xr, xg  # the five mixes' storage goes before the WKV's own
        w = torch.addmm(self.time_decay.reshape(1, -1).to(lora.dtype), lora, self.time_decay_w2)
        bonus = self.time_faaaa.to(r.dtype) if self.cast_decays else self.time_faaaa
        y = wkv(r, k, v, w.view(batch, time, -1), bonus, impl=self.wkv_impl).to(self.ln_x.weight.dtype)
        y = F.group_norm(
            y.view(batch * time, -1), self.n_head, self.ln_x.weight, self.ln_x.bias, self.ln_x.eps
        )
        return self.output(y.view(batch, time, -1).mul_(g))

    def forward(self, x: torch.Tensor, x_shifted: torch.Tensor) -> torch.Tensor:
        if self.mix_impl == "torch" and inference_path(x):
            return self._forward_inference(x, x_shifted)
        batch, time, _ = x.shape
        xw, xk, xv, xr, xg = self._mixes(x, x_shifted)

        r = self.receptance(xr)
        k = self.key(xk)
        v = self.value(xv)
        g = F.silu(self.gate(xg))
        ww = torch.tanh(xw @ self.time_decay_w1) @ self.time_decay_w2
        decay, bonus = self.time_decay, self.time_faaaa
        if self.cast_decays:
            # Under bf16 autocast the sum below is then rounded to bf16 as in the original.
            decay, bonus = decay.to(ww.dtype), bonus.to(r.dtype)
        w = decay + ww

        # WKV answers in float32; a model cast to bf16/fp16 has ln_x weights in that dtype, and
        # GroupNorm takes no float32 input with them. With float32 weights (training's autocast)
        # this is a no-op.
        y = wkv(r, k, v, w, bonus, impl=self.wkv_impl).to(self.ln_x.weight.dtype)
        y = self.ln_x(y.reshape(batch * time, -1)).reshape(batch, time, -1)
        return self.output(y * g)


def orthogonal_scaled_(weight: torch.Tensor, scale: float) -> None:
    """Orthogonal init with gain sqrt(out/in) when out > in, times `scale` (0 zeroes)."""
    out_features, in_features = weight.shape
    if scale == 0.0:
        nn.init.zeros_(weight)
        return
    gain = math.sqrt(out_features / in_features) if out_features > in_features else 1.0
    nn.init.orthogonal_(weight, gain=gain * scale)
