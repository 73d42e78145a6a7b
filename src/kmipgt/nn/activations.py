"""ReLU for compiled CPU training: the backward reads the output, not a boolean mask.

Inductor's CPU code saves ReLU's gradient mask (``output <= 0``) as a bool tensor wherever the output itself
is not kept for the backward (a ReLU followed by a residual sum, as in GatedGCN). Its vectorized stores
of bool masks are about 20 times slower than aten's elementwise kernels (torch 2.11 to 2.13, AVX2 and
AVX-512 alike), which made a compiled GatedGCN step slower than the eager one. Under compile on the CPU,
:func:`relu` therefore saves its float output and multiplies the gradient by the output's sign, which is
ReLU's gradient exactly (1 where the output is positive, 0 where it is zero); from torch 2.13 the graph
then saves no mask (before it, the partitioner still saves one). Eager code, CUDA and ``torch.export`` use
:func:`torch.relu` itself.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["relu"]


class _ReLUFromOutput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        y = x.clamp_min(0)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (y,) = ctx.saved_tensors
        return grad * y.sign()


def relu(x: Tensor) -> Tensor:
    """``max(x, 0)``, elementwise (``x [*]`` -> ``[*]``), with :func:`torch.relu`'s values and gradients."""
    if (torch.compiler.is_compiling() and not torch.compiler.is_exporting() and x.device.type == "cpu"
            and x.requires_grad):
        return _ReLUFromOutput.apply(x)
    return torch.relu(x)
