"""BatchNorm over the real rows of a padded batch: padding rows are normalised but never counted.

A mini-batch packed to a fixed node and edge budget (``data.pad_to``, :mod:`kmipgt.train.padding`) carries
padding rows after its real ones. BatchNorm's batch statistics (and so its running statistics) are sums over
rows, so the padding rows must not enter them: :func:`masked_batch_norm` takes the mean and the variance of
the rows ``mask`` marks, and equals ``BatchNorm1d`` on those rows alone to float rounding, gradients included.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["masked_batch_norm"]


def masked_batch_norm(norm: torch.nn.BatchNorm1d, x: Tensor, mask: Tensor | None) -> Tensor:
    """``norm(x)`` for ``x [N, C]`` whose batch statistics are those of the rows ``mask`` (``[N]`` bool, True:
    a real row) marks; ``mask`` None: ``norm(x)`` itself.

    In training (or without running statistics) the mean and the biased variance are taken over the real
    rows, in two passes as ``F.batch_norm`` does, and the running statistics are updated as BatchNorm's
    (momentum or cumulative average, the variance unbiased over the real rows). In evaluation with running
    statistics each row is normalised on its own, so the padding rows change nothing and ``norm`` runs
    as it is. The padding rows' outputs are finite and are not read.
    """
    if mask is None:
        return norm(x)
    if x.dim() != 2 or mask.shape != x.shape[:1]:
        raise ValueError(f"masked_batch_norm takes x [N, C] and mask [N], got {tuple(x.shape)} and "
                         f"{tuple(mask.shape)}")
    use_batch = norm.training or not norm.track_running_stats
    if not use_batch:
        return norm(x)
    dtype = x.dtype
    values = x.to(torch.promote_types(x.dtype, torch.float32))  # at least float32 (bf16 autocast)
    weight = mask.to(values.dtype).unsqueeze(1)
    count = weight.sum()
    mean = (values * weight).sum(0) / count
    centred = values - mean
    var = (centred * centred * weight).sum(0) / count
    if norm.training and norm.track_running_stats:
        with torch.no_grad():
            norm.num_batches_tracked.add_(1)
            if norm.momentum is None:
                factor = 1.0 / norm.num_batches_tracked.to(values.dtype)
            else:
                factor = norm.momentum
            unbiased = var * count / (count - 1).clamp(min=1)
            norm.running_mean.lerp_(mean.detach().to(norm.running_mean.dtype), factor)
            norm.running_var.lerp_(unbiased.detach().to(norm.running_var.dtype), factor)
    out = centred * torch.rsqrt(var + norm.eps)
    if norm.affine:
        out = out * norm.weight + norm.bias
    return out.to(dtype)
