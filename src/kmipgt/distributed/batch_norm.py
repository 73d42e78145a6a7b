"""BatchNorm over the global batch of a DDP run: statistics all-reduced across ranks, on any backend.

Per-rank BatchNorm would normalise each rank's share by its own statistics, so P ranks would not train
the model one process trains on the whole batch. ``torch.nn.SyncBatchNorm`` fixes that on GPUs only; this
module does the same with differentiable all-reduces, so it runs wherever the backend does (gloo on CPU).
"""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn.modules.batchnorm import _BatchNorm

__all__ = ["GlobalBatchNorm", "global_batch_norms"]


class _SumAcrossRanks(torch.autograd.Function):
    """All-reduce (sum) whose backward all-reduces the gradient: every rank's loss reaches every input."""

    @staticmethod
    def forward(ctx, tensor: Tensor) -> Tensor:
        total = tensor.clone()
        dist.all_reduce(total)
        return total

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        total = grad.clone()
        dist.all_reduce(total)
        return total


def _sum_across_ranks(tensor: Tensor) -> Tensor:
    return _SumAcrossRanks.apply(tensor)


class GlobalBatchNorm(_BatchNorm):
    """``BatchNorm1d`` on ``[n_r, C]`` rows whose training statistics are those of every rank's rows.

    Mean and variance are computed in two passes (as ``F.batch_norm`` does, not from E[x²] − E[x]²), each
    an all-reduce whose backward all-reduces the gradients: the gradient of a rank's rows through the
    statistics includes every rank's loss, as in one process. Evaluation, and training outside a process
    group of several ranks, is plain ``BatchNorm1d``. Parameters and buffers are ``BatchNorm1d``'s.
    """

    def _check_input_dim(self, input: Tensor) -> None:
        if input.dim() != 2:
            raise ValueError(f"expected [N, C] input, got shape {tuple(input.shape)}")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        if not (self.training and dist.is_initialized() and dist.get_world_size() > 1):
            return super().forward(input)
        count = _sum_across_ranks(input.new_tensor([float(input.shape[0])]))
        mean = _sum_across_ranks(input.sum(0)) / count
        centred = input - mean
        var = _sum_across_ranks((centred * centred).sum(0)) / count
        if self.track_running_stats:
            self._update_running_stats(mean.detach(), var.detach(), float(count))
        out = centred * torch.rsqrt(var + self.eps)
        return out * self.weight + self.bias if self.affine else out

    @torch.no_grad()
    def _update_running_stats(self, mean: Tensor, var: Tensor, count: float) -> None:
        """What ``BatchNorm1d`` keeps: momentum (or cumulative) averages, the variance unbiased."""
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        # Under bf16 autocast the statistics come in the input's dtype; the buffers stay float32.
        self.running_mean.lerp_(mean.to(self.running_mean.dtype), factor)
        self.running_var.lerp_((var * count / max(count - 1.0, 1.0)).to(self.running_var.dtype), factor)


def global_batch_norms(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every ``BatchNorm1d`` replaced, in place, by a :class:`GlobalBatchNorm` holding the
    same parameters and buffers (the state dict is unchanged, so checkpoints load either way)."""
    for name, child in module.named_children():
        if isinstance(child, torch.nn.BatchNorm1d):
            replacement = GlobalBatchNorm(
                child.num_features, child.eps, child.momentum, child.affine, child.track_running_stats
            ).to(next(itertools.chain(child.parameters(), child.buffers()), torch.empty(0)).device)
            replacement.load_state_dict(child.state_dict())
            setattr(module, name, replacement)
        else:
            global_batch_norms(child)
    return module
