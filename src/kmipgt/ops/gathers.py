"""Gathers of selected key rows per query and head, and their adjoint, in row chunks of bounded memory.

What k-MIP attention computes on its selected keys, shared by :mod:`kmipgt.ops.attention` and the sharded
attention of :mod:`kmipgt.distributed`, where the selected keys arrive block by block.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["accumulate_dtype", "gathered_dot", "gathered_sum", "scatter_rows"]

# Rows of gathered [rows, H, k, d] keys/values are processed in chunks of about this many elements, so the
# transient memory of the gathers is bounded while autograd saves only O(N·H·k).
_GATHER_ELEMENTS = 1 << 22


def accumulate_dtype(tensor: Tensor) -> torch.dtype:
    """The dtype products and softmaxes of ``tensor`` are computed in: at least float32."""
    return torch.promote_types(tensor.dtype, torch.float32)


def _chunk_rows(index: Tensor, width: int) -> int:
    """Rows per chunk so that a gathered ``[rows, H, k, width]`` tensor stays near the element budget."""
    return max(1, _GATHER_ELEMENTS // max(1, index.shape[1] * index.shape[2] * width))


def gathered_dot(a: Tensor, b: Tensor, index: Tensor) -> Tensor:
    """``out[n, h, j] = a[n, h] · b[index[n, h, j], h]``; a, b ``[N, H, d]``, index ``[N, H, k]``.

    Computed and returned in :func:`accumulate_dtype`: a float16 product overflows at 65,504.
    """
    heads = torch.arange(index.shape[1], device=index.device)[None, :, None]
    accumulate = accumulate_dtype(a)
    out = a.new_empty(index.shape, dtype=accumulate)
    step = _chunk_rows(index, b.shape[-1])
    for r0 in range(0, index.shape[0], step):
        rows = slice(r0, r0 + step)
        gathered = b[index[rows], heads].to(accumulate)
        out[rows] = torch.matmul(gathered, a[rows, :, :, None].to(accumulate))[..., 0]
    return out


def gathered_sum(weights: Tensor, b: Tensor, index: Tensor) -> Tensor:
    """``out[n, h] = Σ_j weights[n, h, j] · b[index[n, h, j], h]``; returns ``[N, H, d_b]``."""
    heads = torch.arange(index.shape[1], device=index.device)[None, :, None]
    out = b.new_empty(index.shape[0], index.shape[1], b.shape[-1])
    step = _chunk_rows(index, b.shape[-1])
    for r0 in range(0, index.shape[0], step):
        rows = slice(r0, r0 + step)
        out[rows] = torch.matmul(weights[rows, :, None, :], b[index[rows], heads])[:, :, 0]
    return out


def scatter_rows(weights: Tensor, a: Tensor, index: Tensor, num_rows: int) -> Tensor:
    """Adjoint of the gathers: ``out[index[m, h, j], h] += weights[m, h, j] · a[m, h]``, ``[num_rows, H, d]``.

    ``index`` ``[M, H, k]`` points into the ``num_rows`` (N) key rows, which need not be M.
    """
    num_queries, heads, _ = index.shape
    width = a.shape[-1]
    accumulate = accumulate_dtype(a)
    out = torch.zeros(num_rows * heads, width, dtype=accumulate, device=a.device)
    head_offset = torch.arange(heads, device=index.device)[None, :, None]
    step = _chunk_rows(index, width)
    for r0 in range(0, num_queries, step):
        rows = slice(r0, r0 + step)
        targets = (index[rows] * heads + head_offset).reshape(-1)
        contributions = weights[rows, :, :, None] * a[rows, :, None, :]
        out.index_add_(0, targets, contributions.reshape(-1, width).to(accumulate))
    return out.view(num_rows, heads, width).to(a.dtype)
