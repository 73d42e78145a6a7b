"""Weighted kernel sums over a sparse pattern, a bounded chunk of rows at a time (forward and backward).

``out_i = Σ_{(i, j) stored} w_ij (a_i · b_j) c_j`` is the edge-list form of feature-map attention. Done
as one SDDMM and one SpMM over the whole pattern, a call allocates several ``[nnz]`` and ``[nnz, F]``
temporaries: hundreds of MB at N = 2^18 with 4 heads. glibc serves every allocation above its mmap
threshold (at most 32 MiB) with fresh pages that fault on first touch, so from about 2^17 nodes on each
call paid page faults for every byte of every temporary and the time grew ×7 per ×4 N. Processing rows
in chunks of a few MiB keeps the temporaries in the heap. The kernel values are recomputed in the
backward instead of saved, so no ``[nnz]`` tensor lives from forward to backward.

:func:`normalised_kernel_attention` goes one step further for ReLU features without a global term (what
``GRFAttention`` runs by default): the query features, the sums and the normalisation are done chunk by
chunk too, and the output is written node-major, so only the output is allocated at full size.

The result does not depend on the chunk size, bit for bit on CPU: a row-side sum is a per-row product,
and a column-side sum (the gradients of ``b`` and ``c``) is accumulated into one buffer in row order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from kmipgt.grf.sparse import CSRPattern, csr_product, sddmm

__all__ = [
    "CHUNK_BYTES",
    "FUSED_FEATURE_MAPS",
    "default_chunk_rows",
    "normalised_kernel_attention",
    "normalised_kernel_attention_rows",
    "weighted_kernel_sums",
]

FUSED_FEATURE_MAPS = ("relu",)
"""Feature maps :func:`normalised_kernel_attention` applies to the queries itself, chunk by chunk. Only
ReLU: it rounds nothing, whereas vectorised ``exp`` (elu) rounds differently in a loop's scalar tail, so
its value would depend on where a chunk ends."""

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


def _chunks(pattern: CSRPattern, chunk_rows: int, segment: int | None = None) -> Iterator[_Chunk]:
    """The pattern's rows in consecutive chunks of ``chunk_rows``; no chunk crosses a multiple of
    ``segment`` (a head's block of rows; default: the whole pattern)."""
    num_rows = pattern.num_nodes
    segment = segment or max(num_rows, 1)
    starts = [
        a for s in range(0, num_rows, segment) for a in range(s, min(s + segment, num_rows), chunk_rows)
    ]
    # Chunks are consecutive: each one stops where the next starts.
    bounds = [*starts, num_rows]
    offsets = pattern.crow[torch.tensor(bounds, device=pattern.crow.device)].tolist()
    for i, start in enumerate(starts):
        yield _chunk(pattern, start, bounds[i + 1], offsets[i], offsets[i + 1])


def _chunk(pattern: CSRPattern, start: int, stop: int, first: int, last: int) -> _Chunk:
    """Rows ``start:stop`` of ``pattern``, whose entries are ``first:last``."""
    return _Chunk(
        start,
        stop,
        first,
        last,
        pattern.row[first:last] - start,
        pattern.crow[start : stop + 1] - first,
        pattern.col[first:last],
        pattern.num_nodes,
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


def _row_block(x: Tensor, chunk: _Chunk, num_nodes: int) -> Tensor:
    """Rows of node-major ``[N, H, F]`` that the chunk's block rows ``h·N + i`` stand for: ``[rows, F]``."""
    head, start = divmod(chunk.start, num_nodes)
    return x[start : start + chunk.stop - chunk.start, head].contiguous()


class _NormalisedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pattern, weights, query, phi_k, value1, eps, chunk_rows):
        n = query.shape[0]
        ctx.save_for_backward(weights, query, phi_k, value1)
        ctx.pattern, ctx.eps, ctx.chunk_rows = pattern, eps, chunk_rows
        dim_v = value1.shape[1] - 1
        out = value1.new_empty(n, query.shape[1], dim_v)
        for c in _chunks(pattern, chunk_rows, n):
            sums = _chunk_sums(c, weights, torch.relu(_row_block(query, c, n)), phi_k, value1)
            head, start = divmod(c.start, n)
            out[start : start + c.stop - c.start, head] = sums[:, :dim_v] / (sums[:, dim_v:] + eps)
        return out

    @staticmethod
    def backward(ctx, grad):
        weights, query, phi_k, value1 = ctx.saved_tensors
        n, dim_v = query.shape[0], value1.shape[1] - 1
        need_w, need_query, need_key, need_value = ctx.needs_input_grad[1:5]
        grad_w = torch.empty_like(weights) if need_w else None
        grad_query = torch.empty_like(query) if need_query else None
        grad_phi_k = torch.zeros_like(phi_k) if need_key else None
        grad_value1 = torch.zeros_like(value1) if need_value else None
        for c in _chunks(ctx.pattern, ctx.chunk_rows, n):
            head, start = divmod(c.start, n)
            stop = start + c.stop - c.start
            q = _row_block(query, c, n)
            phi_q = torch.relu(q)
            kernel = sddmm(c.crow, c.col, phi_q, phi_k, c.shape)
            w = weights[c.first : c.last]
            sums = csr_product(c.row, c.crow, c.col, kernel * w, value1, c.shape)
            # Recomputed rather than saved: nothing of size nnz or N lives from forward to backward.
            denominator = sums[:, dim_v:] + ctx.eps
            g = grad[start:stop, head]
            # out = numerator / denominator: d/dnumerator = g / den, d/dden = -(g · out) / den.
            grad_denominator = -(g * sums[:, :dim_v]).sum(-1, keepdim=True) / denominator**2
            grad_sums = torch.cat([g / denominator, grad_denominator], dim=1)
            grad_weighted = sddmm(c.crow, c.col, grad_sums, value1, c.shape)
            if need_w:
                grad_w[c.first : c.last] = grad_weighted * kernel
            grad_kernel = grad_weighted * w
            if need_query:
                grad_phi_q = csr_product(c.row, c.crow, c.col, grad_kernel, phi_k, c.shape)
                grad_query[start:stop, head] = grad_phi_q * (q > 0)
            if need_key:
                grad_phi_k.index_add_(0, c.col, grad_kernel[:, None] * phi_q[c.row])
            if need_value:
                grad_value1.index_add_(0, c.col, (kernel * w)[:, None] * grad_sums[c.row])
        return None, grad_w, grad_query, grad_phi_k, grad_value1, None, None


def _chunk_sums(c: _Chunk, weights: Tensor, phi_q: Tensor, phi_k: Tensor, value1: Tensor) -> Tensor:
    """``[rows, e]``: ``Σ_j w_ij (φ(q_i)·φ(k_j)) value1_j`` for the chunk's rows."""
    kernel = sddmm(c.crow, c.col, phi_q, phi_k, c.shape)
    return csr_product(c.row, c.crow, c.col, kernel * weights[c.first : c.last], value1, c.shape)


def normalised_kernel_attention(
    pattern: CSRPattern, weights: Tensor, query: Tensor, phi_k: Tensor, value1: Tensor, feature_map: str, *,
    eps: float, chunk_rows: int | None = None,
) -> Tensor:
    """Feature-map attention over a block-diagonal pattern, normalised, straight into node-major output.

    ``out[i, h] = s_i[:d_v] / (s_i[d_v] + eps)`` with ``s_i = Σ_j w_ij (φ(q_i)·φ(k_j)) value1_j`` for the
    block row ``i' = h·N + i``. The queries' feature map, the sums and the normalisation run a chunk of
    rows at a time inside one autograd function, so that beside the inputs only the ``[N, H, d_v]``
    output is allocated at full size: the node-major result needs no transposed copy, and the query
    features, sums and quotients (one ``[H, N, ·]`` tensor each, faulting in fresh pages at large N)
    never exist whole.

    Args:
        pattern: ``[H·N, H·N]`` block-diagonal CSR pattern, head-major rows.
        weights: ``[nnz]`` mask values in the pattern's order.
        query: ``[N, H, d]`` raw queries (``φ`` is applied here).
        phi_k: ``[H·N, d]`` key features, head-major. value1: ``[H·N, d_v + 1]`` ``[v, 1]``, head-major.
        feature_map: ``"relu"`` (:data:`FUSED_FEATURE_MAPS`).
        eps: added to the normaliser. chunk_rows: as in :func:`weighted_kernel_sums` (a chunk never
            spans two heads); every value gives the same result, bit for bit on CPU.

    Returns:
        ``[N, H, d_v]``, contiguous.
    """
    if feature_map not in FUSED_FEATURE_MAPS:
        raise ValueError(f"`feature_map` must be one of {FUSED_FEATURE_MAPS}, got {feature_map!r}")
    if chunk_rows is None:
        width = max(phi_k.shape[1], value1.shape[1])
        chunk_rows = default_chunk_rows(pattern, width, value1.element_size())
    if chunk_rows < 1:
        raise ValueError(f"`chunk_rows` must be positive, got {chunk_rows}")
    if pattern.num_nodes != query.shape[0] * query.shape[1]:
        rows = query.shape[0] * query.shape[1]
        raise ValueError(f"pattern is for {pattern.num_nodes} rows, the queries have {rows} (N·H)")
    return _NormalisedAttention.apply(
        pattern, weights.to(value1.dtype), query, phi_k, value1, eps, chunk_rows
    )


def normalised_kernel_attention_rows(
    pattern: CSRPattern, weights: Tensor, query: Tensor, phi_k: Tensor, value1: Tensor, start: int, *,
    eps: float,
) -> Tensor:
    """Rows ``start:start + c`` of :func:`normalised_kernel_attention`, from those nodes' queries alone.

    For a caller that builds the queries a chunk of nodes at a time (``GRFAttention`` without autograd).
    Each row's sums use only that row's entries, so the rows are those of the whole call bit for bit on
    CPU, whatever the chunks. No autograd: the backward of the whole call needs all queries.

    Args:
        pattern, weights, phi_k, value1, feature map (ReLU): as in :func:`normalised_kernel_attention`.
        query: ``[c, H, d]`` raw queries of nodes ``start:start + c``.
        start: the first node.
        eps: added to the normaliser.

    Returns:
        ``[c, H, d_v]``.
    """
    rows, heads = query.shape[:2]
    num_nodes = pattern.num_nodes // heads
    if pattern.num_nodes != num_nodes * heads or not 0 <= start <= num_nodes - rows:
        raise ValueError(
            f"nodes {start}:{start + rows} of {heads} heads do not lie in a pattern of "
            f"{pattern.num_nodes} rows"
        )
    if phi_k.shape[0] != pattern.num_nodes or value1.shape[0] != pattern.num_nodes:
        raise ValueError(
            f"`phi_k` and `value1` must have the pattern's {pattern.num_nodes} rows (H·N), got "
            f"{phi_k.shape[0]} and {value1.shape[0]}"
        )
    dim_v = value1.shape[1] - 1
    out = value1.new_empty(rows, heads, dim_v)
    bounds = [h * num_nodes + b for h in range(heads) for b in (start, start + rows)]
    offsets = pattern.crow[torch.tensor(bounds, device=pattern.crow.device)].tolist()
    weights = weights.to(value1.dtype)
    for head in range(heads):
        first, last = offsets[2 * head], offsets[2 * head + 1]
        c = _chunk(pattern, bounds[2 * head], bounds[2 * head + 1], first, last)
        sums = _chunk_sums(c, weights, torch.relu(query[:, head].contiguous()), phi_k, value1)
        out[:, head] = sums[:, :dim_v] / (sums[:, dim_v:] + eps)
    return out
