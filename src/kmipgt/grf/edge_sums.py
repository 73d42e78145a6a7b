"""Weighted kernel sums over a sparse pattern, a bounded chunk of rows at a time (forward and backward).

``out_i = Σ_{(i, j) stored} w_ij (a_i · b_j) c_j`` is the edge-list form of feature-map attention. Done
as one SDDMM and one SpMM over the whole pattern, a call allocates several ``[nnz]`` and ``[nnz, F]``
temporaries: hundreds of MB at N = 2^18 with 4 heads. glibc serves every allocation above its mmap
threshold (at most 32 MiB) with fresh pages that fault on first touch, so from about 2^17 nodes on each
call paid page faults for every byte of every temporary and the time grew ×7 per ×4 N. Processing rows
in chunks of a few MiB keeps the temporaries in the heap. The kernel values are recomputed in the
backward instead of saved, so no ``[nnz]`` tensor lives from forward to backward.

The result does not depend on the chunk size, bit for bit on CPU: a row-side sum is a per-row product,
and a column-side sum (the gradients of ``b`` and ``c``) is accumulated into one buffer in row order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from kmipgt.grf.sparse import CSRPattern, csr_product, sddmm

__all__ = ["CHUNK_BYTES", "default_chunk_rows", "weighted_kernel_sums"]

CHUNK_BYTES = 4 * 2**20
"""Target size of the largest temporary of one chunk: far below glibc's 32 MiB mmap threshold."""


@dataclass(frozen=True)
class _Chunk:
    """Rows ``start:stop`` of a CSR pattern, their entries ``first:last`` and the local CSR arrays."""

    start: int
    stop: int
    first: int
    last: int
    row: Tensor
    crow: Tensor
    col: Tensor
    num_cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.stop - self.start, self.num_cols


def _chunks(pattern: CSRPattern, chunk_rows: int) -> Iterator[_Chunk]:
    """The pattern's rows in consecutive chunks of ``chunk_rows`` (the last one shorter)."""
    num_rows = pattern.num_nodes
    starts = list(range(0, num_rows, chunk_rows))
    bounds = pattern.crow[torch.tensor([*starts, num_rows], device=pattern.crow.device)].tolist()
    for i, start in enumerate(starts):
        stop, first, last = min(start + chunk_rows, num_rows), bounds[i], bounds[i + 1]
        yield _Chunk(
            start,
            stop,
            first,
            last,
            pattern.row[first:last] - start,
            pattern.crow[start : stop + 1] - first,
            pattern.col[first:last],
            num_rows,
        )


def default_chunk_rows(pattern: CSRPattern, width: int, element_size: int = 4) -> int:
    """Rows per chunk so that an ``[entries, width]`` temporary of one chunk takes about ``CHUNK_BYTES``."""
    entries_per_row = max(pattern.col.numel() / max(pattern.num_nodes, 1), 1.0)
    return max(1, int(CHUNK_BYTES / (element_size * max(width, 1) * entries_per_row)))


class _WeightedKernelSums(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pattern, weights, left, right, value, chunk_rows):
        left, right, value = left.contiguous(), right.contiguous(), value.contiguous()
        ctx.save_for_backward(weights, left, right, value)
        ctx.pattern, ctx.chunk_rows = pattern, chunk_rows
        out = value.new_empty(left.shape[0], value.shape[1])
        for c in _chunks(pattern, chunk_rows):
            kernel = sddmm(c.crow, c.col, left[c.start : c.stop], right, c.shape)
            weighted = kernel * weights[c.first : c.last]
            out[c.start : c.stop] = csr_product(c.row, c.crow, c.col, weighted, value, c.shape)
        return out

    @staticmethod
    def backward(ctx, grad):
        weights, left, right, value = ctx.saved_tensors
        grad = grad.contiguous()
        need_w, need_left, need_right, need_value = ctx.needs_input_grad[1:5]
        grad_w = torch.empty_like(weights) if need_w else None
        grad_left = torch.empty_like(left) if need_left else None
        grad_right = torch.zeros_like(right) if need_right else None
        grad_value = torch.zeros_like(value) if need_value else None
        for c in _chunks(ctx.pattern, ctx.chunk_rows):
            rows = slice(c.start, c.stop)
            kernel = sddmm(c.crow, c.col, left[rows], right, c.shape)
            grad_weighted = sddmm(c.crow, c.col, grad[rows], value, c.shape)
            w = weights[c.first : c.last]
            if need_w:
                grad_w[c.first : c.last] = grad_weighted * kernel
            grad_kernel = grad_weighted * w
            if need_left:
                grad_left[rows] = csr_product(c.row, c.crow, c.col, grad_kernel, right, c.shape)
            if need_right:
                grad_right.index_add_(0, c.col, grad_kernel[:, None] * left[rows][c.row])
            if need_value:
                grad_value.index_add_(0, c.col, (kernel * w)[:, None] * grad[rows][c.row])
        return None, grad_w, grad_left, grad_right, grad_value, None


def weighted_kernel_sums(
    pattern: CSRPattern, weights: Tensor, left: Tensor, right: Tensor, value: Tensor, *,
    chunk_rows: int | None = None,
) -> Tensor:
    """``out_i = Σ_{(i, j) in pattern} w_ij (left_i · right_j) value_j``, with gradients to all four.

    Args:
        pattern: square ``[R, R]`` CSR pattern with ``nnz`` entries.
        weights: ``[nnz]`` in the pattern's order.
        left, right: ``[R, m]``.
        value: ``[R, e]``.
        chunk_rows: rows per chunk; ``None`` sizes the chunks with :func:`default_chunk_rows`. The
            result is the same for every chunk size (bit for bit on CPU).

    Returns:
        ``[R, e]``.
    """
    if chunk_rows is None:
        width = max(left.shape[1], value.shape[1])
        chunk_rows = default_chunk_rows(pattern, width, value.element_size())
    if chunk_rows < 1:
        raise ValueError(f"`chunk_rows` must be positive, got {chunk_rows}")
    if pattern.num_nodes != left.shape[0]:
        raise ValueError(f"pattern is for {pattern.num_nodes} rows, the operands have {left.shape[0]}")
    return _WeightedKernelSums.apply(pattern, weights.to(value.dtype), left, right, value, chunk_rows)
