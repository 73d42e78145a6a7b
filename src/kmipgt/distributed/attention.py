"""Query-sharded exact k-MIP attention: each rank owns a block of nodes, key blocks travel around a ring.

Forward: the key blocks go once around the ring; each rank searches every visiting block for its queries'
top-k (:func:`kmipgt.ops.topk_inner_product` with the block's key layout) and merges it into a running
top-k, ordered by score and then global index as the single-process search orders ties. After the softmax
over the k winners, the value blocks go around once more to sum the winners' values. Backward: the key
and value blocks go around with gradient accumulators that every rank adds its queries' contributions to;
one last step brings each accumulator home. No rank ever holds more than its own block and one visitor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from kmipgt.distributed.counter import active_counter
from kmipgt.distributed.layout import ShardLayout, check_local_batch, shard_layout
from kmipgt.distributed.ring import Ring
from kmipgt.ops import topk_inner_product
from kmipgt.ops.gathers import gathered_dot, gathered_sum, scatter_rows
from kmipgt.ops.search.checks import check_query_key, require_finite
from kmipgt.ops.search.dispatch import Backend

__all__ = ["sharded_kmip_attention"]

_Selection = tuple[Tensor, Tensor, Tensor]  # scores, global indices, logits: each [n_r, H, k]


def _blocks(ring: Ring, layout: ShardLayout, tensors: list[Tensor], phase: str):
    """Yield ``(source, tensors of block source)`` for every rank's block, own first, then passed along.

    The caller may update the yielded tensors in place before the next block arrives (the accumulators
    of backward travel that way); the last ones yielded stay with this rank.
    """
    for step in range(ring.size):
        source = (ring.rank - step) % ring.size
        yield source, tensors
        if step < ring.size - 1:
            tensors = ring.shift(tensors, layout.rows((source - 1) % ring.size), phase)


def _merge(best: _Selection | None, new: _Selection, k: int) -> _Selection:
    """The k best of two selections by decreasing score, ties by lower global index (two stable sorts)."""
    if best is None:
        return new
    scores, index, logits = (torch.cat([a, b], -1) for a, b in zip(best, new))
    order = index.argsort(dim=-1, stable=True)
    scores, index, logits = (t.gather(-1, order) for t in (scores, index, logits))
    order = scores.argsort(dim=-1, descending=True, stable=True)[..., :k]
    return scores.gather(-1, order), index.gather(-1, order), logits.gather(-1, order)


def _search(
    query: Tensor, key: Tensor, k: int, scale: float, backend: Backend, ring: Ring, layout: ShardLayout
) -> _Selection:
    """Exact global top-k of every local query over the key blocks of all ranks, and the winners' logits.

    Returns ``[n_r, H, k]`` scores (query dtype), int64 global key indices (``-1`` where the query's graph
    has fewer than k nodes) and scaled logits (float32 or wider, ``-inf`` at padding).
    """
    best = None
    for source, (block,) in _blocks(ring, layout, [key], "forward"):
        visible = layout.visible_keys(source)
        if visible is None:
            continue
        start, end, key_ptr = visible
        keys = block[start:end]
        scores, index = topk_inner_product(
            query, keys, k, ptr=layout.local_ptr, key_ptr=key_ptr, backend=backend, check_finite=False
        )
        # Logits are recomputed from the winning pairs as the single-process op does (float32 or wider).
        logits = gathered_dot(query, keys, index.clamp(min=0)) * scale
        valid = index >= 0
        global_index = torch.where(valid, index + layout.offsets[source] + start, -1)
        best = _merge(best, (scores, global_index, logits.masked_fill(~valid, float("-inf"))), k)
    return best


def _in_block(index: Tensor, layout: ShardLayout, source: int) -> tuple[Tensor, Tensor]:
    """``[n_r, H, k]`` mask of the selected keys that live in block ``source``; their rows there (else 0)."""
    lo, hi = layout.offsets[source], layout.offsets[source + 1]
    inside = (index >= lo) & (index < hi)
    return inside, torch.where(inside, index - lo, 0)


class _ShardedKMIP(torch.autograd.Function):
    """Forward and backward of :func:`sharded_kmip_attention` on this rank's block (see the module doc)."""

    @staticmethod
    def forward(ctx, query, key, value, k, scale, dropout_p, backend, ring, layout):
        _, index, logits = _search(query, key, k, scale, backend, ring, layout)
        valid = index >= 0
        weights = torch.softmax(logits, dim=-1).masked_fill(~valid, 0.0)
        keep = None if dropout_p == 0 else torch.rand_like(weights) >= dropout_p
        dropped = weights if keep is None else weights * keep / (1.0 - dropout_p)
        out = value.new_zeros(query.shape[0], value.shape[1], value.shape[2])
        for source, (block,) in _blocks(ring, layout, [value], "forward"):
            inside, rows = _in_block(index, layout, source)
            if bool(inside.any()):
                out += gathered_sum((dropped * inside).to(value.dtype), block, rows)
        ctx.save_for_backward(query, key, value, index, weights, keep, out)
        ctx.scale, ctx.dropout_p, ctx.ring, ctx.layout = scale, dropout_p, ring, layout
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, index, weights, keep, out = ctx.saved_tensors
        ring, layout = ctx.ring, ctx.layout
        dropped = weights if keep is None else weights * keep / (1.0 - ctx.dropout_p)
        # Σ_j w_ij ∂L/∂w_ij = dO_i · O_i: the softmax's backward needs no second pass over the blocks.
        row_dot = (grad_out.to(weights.dtype) * out.to(weights.dtype)).sum(-1, keepdim=True)
        grad_query = torch.zeros_like(query)
        blocks = [key, value, torch.zeros_like(key), torch.zeros_like(value)]
        for source, visitor in _blocks(ring, layout, blocks, "backward"):
            block_key, block_value, grad_key, grad_value = visitor
            inside, rows = _in_block(index, layout, source)
            if not bool(inside.any()):
                continue
            grad_weights = gathered_dot(grad_out, block_value, rows)
            if keep is not None:
                grad_weights = grad_weights * keep / (1.0 - ctx.dropout_p)
            grad_logits = (weights * (grad_weights - row_dot) * ctx.scale * inside).to(query.dtype)
            grad_query += gathered_sum(grad_logits, block_key, rows)
            grad_key += scatter_rows(grad_logits, query, rows, block_key.shape[0])
            kept = (dropped * inside).to(grad_out.dtype)
            grad_value += scatter_rows(kept, grad_out, rows, block_key.shape[0])
        if ring.size > 1:  # the accumulators of block rank + 1, complete now, go home
            grad_key, grad_value = ring.shift([grad_key, grad_value], layout.rows(ring.rank), "backward")
        return grad_query, grad_key, grad_value, None, None, None, None, None, None


def _check_inputs(
    query: Tensor, key: Tensor, value: Tensor, k: int, batch: Tensor | None, dropout_p: float
) -> None:
    """The local checks of :func:`sharded_kmip_attention` (TypeError/ValueError naming the argument)."""
    check_query_key(query, key, k)
    if query.shape[0] != key.shape[0]:
        raise ValueError(f"`query` and `key` must hold the same rows, got {query.shape[0]}, {key.shape[0]}")
    if not isinstance(value, Tensor) or value.dim() != 3 or value.shape[:2] != key.shape[:2]:
        raise ValueError(f"`value` must have shape [n_r, H, d_v] = [{key.shape[0]}, {key.shape[1]}, d_v]")
    if value.dtype != key.dtype or value.device != key.device:
        raise TypeError("`value` must share dtype and device with `query`")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"`dropout_p` must lie in [0, 1), got {dropout_p}")
    check_local_batch(query.shape[0], batch)
    require_finite(query=query, key=key, value=value)


def sharded_kmip_attention(
    query: Tensor, key: Tensor, value: Tensor, k: int, *, group: dist.ProcessGroup | None = None,
    ptr: Tensor | None = None, batch: Tensor | None = None, scale: float | None = None,
    dropout_p: float = 0.0, backend: Backend = "auto",
) -> Tensor:
    r"""k-MIP attention over a node-major batch whose rows are split across the ranks of ``group``.

    Rank r holds the contiguous rows ``offsets[r]:offsets[r + 1]`` of a global ragged batch (rank order is
    row order; the row counts are exchanged, so they may differ). Every query attends to the exact global
    top-k keys of its own graph, wherever they live, and the output and the gradients of query, key and
    value on each rank equal those rows of the single-process :func:`kmipgt.ops.kmip_attention` over the
    whole batch (ties broken by lower global index). Graphs may straddle rank boundaries.

    Communication per call, per rank (``n`` rows per rank, ``P`` ranks, bytes per element ``b``): forward
    ``(P-1)·n·H·(d + d_v)·b``, backward ``(P-1)·n·H·2(d + d_v)·b + n·H·(d + d_v)·b``; memory per rank
    ``O(n·H·(d + d_v + k))`` plus one visiting block. Wrap a call in
    :func:`~kmipgt.distributed.count_communication` to measure it.

    Args:
        query, key: ``[n_r, H, d]`` this rank's rows. value: ``[n_r, H, d_v]``.
        k: keys per query (``>= 1``).
        group: the process group (default: the world); every rank of it must call with its block.
        ptr: ``[G + 1]`` offsets of the graphs of the whole global batch (the same on every rank), or
            batch: ``[n_r]`` global graph ids of this rank's rows (sorted across ranks). Neither: one graph.
        scale: logit scale, default ``1/sqrt(d)``. dropout_p: dropout on the attention weights.
        backend: the exact search backend of :func:`~kmipgt.ops.topk_inner_product` for each key block.

    Returns:
        ``[n_r, H, d_v]`` the attention output of this rank's queries. A bad input on any rank raises on
        every rank (the failing one its own TypeError/ValueError), so no rank waits in a collective.
    """
    if torch.is_autocast_enabled(query.device.type) and value.dtype != query.dtype:
        value = value.to(query.dtype)  # the modules' float32 queries and keys under autocast: one dtype
    try:
        _check_inputs(query, key, value, k, batch, dropout_p)
        error = None
    except (TypeError, ValueError) as caught:
        error = caught
    ring = Ring(group, active_counter())
    layout = shard_layout(query.shape[0], ptr, batch, ring, query.device, error)
    k = min(k, layout.offsets[-1])
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    return _ShardedKMIP.apply(query, key, value, k, scale, float(dropout_p), backend, ring, layout)


