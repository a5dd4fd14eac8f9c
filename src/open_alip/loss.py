"""Symmetric contrastive (InfoNCE) loss over image-text pairs, gathered across ranks.

Every rank contributes its local batch; features are all-gathered so that each sample
is contrasted against the global batch. The module is written so that the gradients
that reach the parameters after DistributedDataParallel's gradient *averaging* equal
those of a single process holding the whole global batch:

* ``gather_with_grad=True``: features are gathered with autograd
  (``torch.distributed.nn``), whose backward sums the gradient each rank computes for
  every slice. Exact for both ``local_loss`` settings.
* ``gather_with_grad=False, local_loss=False`` (the default): the other ranks' features
  are constants and every rank computes the same global loss, so each rank only gets
  the gradient through its own slice. Averaging over W ranks would shrink it by 1/W;
  the local slice's gradient is therefore multiplied by W (the forward value is
  unchanged), which makes the average exact.
* ``gather_with_grad=False, local_loss=True``: each rank drops the cross terms of the
  other ranks' losses. This is the cheap approximation open_clip offers; it is kept for
  compatibility and is *not* equal to the single-process gradient.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class _ScaleGrad(torch.autograd.Function):
    """Identity forward; multiplies the incoming gradient by a constant."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad * ctx.factor, None


def gather_features(
    image_features: torch.Tensor,
    text_features: torch.Tensor,
    *,
    gather_with_grad: bool,
    local_loss: bool,
    rank: int,
    world_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenate the features of all ranks in rank order: ``[W*B, C]`` each."""
    if gather_with_grad:
        from torch.distributed.nn.functional import all_gather as all_gather_with_grad

        return (
            torch.cat(all_gather_with_grad(image_features), dim=0),
            torch.cat(all_gather_with_grad(text_features), dim=0),
        )
    gathered_image = [torch.empty_like(image_features) for _ in range(world_size)]
    gathered_text = [torch.empty_like(text_features) for _ in range(world_size)]
    dist.all_gather(gathered_image, image_features.detach().contiguous())
    dist.all_gather(gathered_text, text_features.detach().contiguous())
    if local_loss:
        # The local rows of the logits already carry the gradient; see the module docstring.
        mine_image, mine_text = image_features, text_features
    else:
        mine_image = _ScaleGrad.apply(image_features, float(world_size))
        mine_text = _ScaleGrad.apply(text_features, float(world_size))
    gathered_image[rank] = mine_image
    gathered_text[rank] = mine_text
    return torch.cat(gathered_image, dim=0), torch.cat(gathered_text, dim=0)


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


class ClipLoss(nn.Module):
    """CLIP loss; call with *unnormalised or normalised* features and exp()'d logit scale.

    ``normalize=True`` L2-normalises the features first, in float32 (the trainer passes the
    model's raw embeddings, ``model(images, tokens, normalize=False)``). ``rank``/``world_size``
    default to the initialised process group, or a single process when there is none.
    """

    def __init__(
        self,
        local_loss: bool = False,
        gather_with_grad: bool = False,
        cache_labels: bool = True,
        rank: int | None = None,
        world_size: int | None = None,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        initialised = dist.is_available() and dist.is_initialized()
        self.rank = rank if rank is not None else (dist.get_rank() if initialised else 0)
        self.world_size = (
            world_size if world_size is not None else (dist.get_world_size() if initialised else 1)
        )
        self.local_loss = local_loss
        self.gather_with_grad = gather_with_grad
        self.cache_labels = cache_labels
        self.normalize = normalize
        self._labels: dict[tuple[torch.device, int], torch.Tensor] = {}

    def _ground_truth(self, device: torch.device, num_logits: int) -> torch.Tensor:
        key = (device, num_logits)
        labels = self._labels.get(key)
        if labels is None:
            labels = torch.arange(num_logits, device=device, dtype=torch.long)
            if self.world_size > 1 and self.local_loss:
                labels = labels + num_logits * self.rank
            if self.cache_labels:
                self._labels[key] = labels
        return labels

    def get_logits(
        self, image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.world_size > 1:
            all_image, all_text = gather_features(
                image_features,
                text_features,
                gather_with_grad=self.gather_with_grad,
                local_loss=self.local_loss,
                rank=self.rank,
                world_size=self.world_size,
            )
            if self.local_loss:
                return logit_scale * image_features @ all_text.T, logit_scale * text_features @ all_image.T
            per_image = logit_scale * all_image @ all_text.T
            return per_image, per_image.T
        per_image = logit_scale * image_features @ text_features.T
        return per_image, per_image.T

    def forward(
        self, image_features: torch.Tensor, text_features: torch.Tensor, logit_scale: torch.Tensor
    ) -> torch.Tensor:
        # The softmax over a large batch wants fp32 even when the towers ran in bf16.
        image_features, text_features, logit_scale = (
            _at_least_fp32(image_features),
            _at_least_fp32(text_features),
            _at_least_fp32(logit_scale),
        )
        if self.normalize:
            image_features = F.normalize(image_features, dim=-1)
            text_features = F.normalize(text_features, dim=-1)
        per_image, per_text = self.get_logits(image_features, text_features, logit_scale)
        labels = self._ground_truth(image_features.device, per_image.shape[0])
        return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2
