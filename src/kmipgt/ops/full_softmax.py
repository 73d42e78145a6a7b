"""Full softmax attention on ragged graphs, the reference k-MIP attention approximates: padded SDPA per
size bucket, and the k largest full-softmax weights with the mass they carry."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt.ops.attention import AttentionSelection, checked_layout, empty_selection
from kmipgt.ops.gathers import accumulate_dtype, gathered_dot
from kmipgt.ops.library import (
    HOST_ROUTED,
    attention_dtypes,
    dropout_seed,
    layout_arguments,
    op_layout,
    recording_autograd,
    replayable_dropout,
    without_autocast,
)
from kmipgt.ops.ragged import GraphBlock, RaggedLayout, graph_blocks, node_graph_bounds
from kmipgt.ops.search.blockwise import MIN_BLOCK_NODES
from kmipgt.ops.search.dispatch import topk_inner_product

__all__ = ["full_attention", "full_attention_topk"]

# Score tiles of the blockwise log-sum-exp (full-softmax normaliser): query rows × key columns × heads.
_LSE_TILE_ELEMENTS = 1 << 24
_LSE_KEY_TILE = 1 << 15


def full_attention(
    query: Tensor, key: Tensor, value: Tensor, *, ptr: Tensor | None = None, batch: Tensor | None = None,
    key_ptr: Tensor | None = None, key_batch: Tensor | None = None, scale: float | None = None,
    dropout_p: float = 0.0, check_finite: bool = True, layout: RaggedLayout | None = None,
) -> Tensor:
    r"""Full softmax attention within each graph, through ``scaled_dot_product_attention``.

    .. math:: \mathrm{out}_i = \sum_{j \in g(i)} \operatorname{softmax}_j(s\, q_i \cdot k_j)\, v_j

    Args:
        query: ``[M, H, d]``. key: ``[N, H, d]``. value: ``[N, H, d_v]``.
        ptr / batch: the queries' ragged graphs, key_ptr / key_batch the keys', as in :func:`kmip_attention`
            (a query whose graph has no keys gets output 0).
        scale: logit scale, default ``1/sqrt(d)``. dropout_p: attention dropout.
        check_finite: raise ValueError on a NaN or inf in query, key or value, as in
            :func:`kmip_attention`.
        layout: instead of ``ptr``/``batch``, the batch's :class:`~kmipgt.ops.ragged.RaggedLayout`, as in
            :func:`kmip_attention`.

    Returns:
        ``[M, H, d_v]``. The graphs are zero-padded to a common size and attended in one SDPA call with a
        key-padding mask (one call per size bucket where sizes are very uneven), each graph its own batch
        entry, so a non-finite value in one graph never reaches another; a graph alone in its bucket runs
        unmasked, so SDPA can use its memory-efficient kernels.
    """
    ptr, key_ptr = checked_layout(
        query, key, value, 1, ptr, batch, scale, dropout_p, check_finite, key_ptr=key_ptr,
        key_batch=key_batch, layout=layout,
    )
    query, key, value = attention_dtypes(query, key, value)
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    dropout_p = float(dropout_p)
    arguments = layout_arguments(layout, ptr, key_ptr)
    seed = dropout_seed(dropout_p)
    return torch.ops.kmipgt.full_attention(query, key, value, *arguments, scale, dropout_p, seed)


@torch.library.custom_op("kmipgt::full_attention", mutates_args=(), tags=HOST_ROUTED)
def _full_attention_op(
    query: Tensor, key: Tensor, value: Tensor, ptr: Tensor | None, key_ptr: Tensor | None,
    device_ptr: Tensor | None, scale: float, dropout_p: float, seed: Tensor | None,
) -> Tensor:
    """:func:`full_attention` on checked inputs: ``ptr``/``key_ptr`` CPU offsets (None: one graph, the
    queries'), ``device_ptr`` ``ptr`` on the device (None: copied), the dropout drawn from ``seed``."""
    with without_autocast(query.device), replayable_dropout(seed, query.device):
        return _full_attention(query, key, value, ptr, key_ptr, device_ptr, scale, dropout_p)


@_full_attention_op.register_fake
def _(query, key, value, ptr, key_ptr, device_ptr, scale, dropout_p, seed):
    return value.new_empty(query.shape[0], value.shape[1], value.shape[2])


@torch.library.custom_op("kmipgt::full_attention_backward", mutates_args=(), tags=HOST_ROUTED)
def _full_attention_backward_op(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, ptr: Tensor | None, key_ptr: Tensor | None,
    device_ptr: Tensor | None, scale: float, dropout_p: float, seed: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`full_attention` with respect to query, key and value, by recomputing the forward
    (the same dropout masks: the same ``seed``) and differentiating it; memory as the forward's."""
    inputs = [t.detach().requires_grad_() for t in (query, key, value)]
    with recording_autograd(), without_autocast(query.device), replayable_dropout(seed, query.device):
        out = _full_attention(*inputs, ptr, key_ptr, device_ptr, scale, dropout_p)
        grads = torch.autograd.grad(out, inputs, grad_out.to(out.dtype), allow_unused=True)
    return tuple(torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs, strict=True))


@_full_attention_backward_op.register_fake
def _(grad_out, query, key, value, ptr, key_ptr, device_ptr, scale, dropout_p, seed):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _save_full_attention_inputs(ctx, inputs, output) -> None:
    query, key, value, ptr, key_ptr, device_ptr, scale, dropout_p, seed = inputs
    ctx.save_for_backward(query, key, value, ptr, key_ptr, device_ptr, seed)
    ctx.scale, ctx.dropout_p = scale, dropout_p


def _full_attention_grads(ctx, grad_out):
    query, key, value, ptr, key_ptr, device_ptr, seed = ctx.saved_tensors
    grads = torch.ops.kmipgt.full_attention_backward(
        grad_out, query, key, value, ptr, key_ptr, device_ptr, ctx.scale, ctx.dropout_p, seed
    )
    return (*grads, None, None, None, None, None, None)


_full_attention_op.register_autograd(_full_attention_grads, setup_context=_save_full_attention_inputs)


def _full_attention(
    query: Tensor, key: Tensor, value: Tensor, ptr: Tensor | None, key_ptr: Tensor | None,
    device_ptr: Tensor | None, scale: float, dropout_p: float,
) -> Tensor:
    """Full attention by padded SDPA per size bucket (or per block of graphs where the keys have their own
    layout), in the queries' and keys' dtype (values are cast to it and the output back)."""
    out_dtype, value = value.dtype, value.to(query.dtype)
    if query.shape[0] == 0:
        return value.new_zeros(0, value.shape[1], value.shape[2], dtype=out_dtype)
    if key_ptr is not None:
        return _blockwise_full_attention(query, key, value, ptr, key_ptr, scale, dropout_p).to(out_dtype)
    layout = op_layout(query.shape[0], ptr, device_ptr, query.device)
    buckets = layout.derived("sdpa_buckets", _size_buckets)
    if len(buckets) == 1 and buckets[0].rows is None:
        return _padded_sdpa(query, key, value, buckets[0], scale, dropout_p).to(out_dtype)
    out = value.new_empty(query.shape[0], value.shape[1], value.shape[2])
    for bucket in buckets:
        out[bucket.rows] = _padded_sdpa(query, key, value, bucket, scale, dropout_p)
    return out.to(out_dtype)


class _SizeBucket(NamedTuple):
    """Graphs attended in one padded SDPA call: their node rows (None: every row, in order), each row's
    graph within the bucket and position in its graph, the graphs' sizes and the padded width."""

    rows: Tensor | None
    graph: Tensor
    position: Tensor
    sizes: Tensor
    width: int
    uniform: bool


# Graphs share one padded call while its G·n_max² scores stay within this factor of the Σ n_g² needed.
_PADDING_WASTE = 4.0


def _size_buckets(layout: RaggedLayout) -> list[_SizeBucket]:
    """The non-empty graphs of ``layout`` in size buckets of bounded padding, as device row tables.

    One bucket when padding every graph to the largest wastes little (a batch of molecules); otherwise
    graphs are grouped by the power of two of their size, so each bucket's padding is under 4×.
    """
    sizes = layout.ptr.diff()
    graphs = (sizes > 0).nonzero().squeeze(1)
    needed = float((sizes.double() ** 2).sum())
    if graphs.numel() * float(sizes.max()) ** 2 <= _PADDING_WASTE * needed:
        groups = [graphs]
    else:
        exponent = torch.floor(torch.log2(sizes[graphs].double())).long()
        groups = [graphs[exponent == value] for value in exponent.unique()]
    return [_bucket(layout, group, every_row=len(groups) == 1) for group in groups]


def _bucket(layout: RaggedLayout, graphs: Tensor, every_row: bool) -> _SizeBucket:
    sizes = layout.ptr.diff()[graphs]
    local = torch.repeat_interleave(torch.arange(graphs.numel()), sizes)
    position = torch.arange(local.numel()) - (sizes.cumsum(0) - sizes)[local]
    rows = layout.ptr[graphs][local] + position
    width = int(sizes.max())
    return _SizeBucket(
        None if every_row else layout.to_device(rows), layout.to_device(local), layout.to_device(position),
        layout.to_device(sizes), width, bool((sizes == width).all()),
    )


def _padded_sdpa(
    query: Tensor, key: Tensor, value: Tensor, bucket: _SizeBucket, scale: float | None, dropout_p: float
) -> Tensor:
    """SDPA over the graphs of ``bucket``, each its own batch entry zero-padded to the bucket's width.

    A block-diagonal mask over all graphs would multiply a NaN value of one graph by the zero weights of
    every other graph's queries (0·NaN = NaN), and cost ``(Σ n_g)²`` scores instead of ``G·n_max²``.
    Padding keys are masked; padding queries see their graph's keys and are dropped.
    """
    if bucket.rows is not None:
        query, key, value = query[bucket.rows], key[bucket.rows], value[bucket.rows]
    num_graphs = bucket.sizes.numel()

    def padded(tensor: Tensor) -> Tensor:
        out = tensor.new_zeros(num_graphs, bucket.width, *tensor.shape[1:])
        out[bucket.graph, bucket.position] = tensor
        return out.transpose(1, 2)  # [G, H, n_max, d]; SDPA's fused CPU kernels need 4-D inputs

    mask = None
    if not bucket.uniform:
        columns = torch.arange(bucket.width, device=query.device)
        mask = (columns < bucket.sizes[:, None])[:, None, None, :]
    attended = F.scaled_dot_product_attention(
        padded(query), padded(key), padded(value), attn_mask=mask, dropout_p=dropout_p, scale=scale
    )
    return attended.transpose(1, 2)[bucket.graph, bucket.position]


def _blockwise_full_attention(
    query: Tensor, key: Tensor, value: Tensor, ptr: Tensor, key_ptr: Tensor, scale: float | None,
    dropout_p: float,
) -> Tensor:
    """Full attention where the keys have graphs of their own: padded SDPA over blocks of graphs."""
    outputs = []
    for block in graph_blocks(ptr, MIN_BLOCK_NODES, key_ptr):
        rows, keys = slice(block.start, block.end), slice(block.key_start, block.key_end)
        sliced = (query[rows], key[keys], value[keys])
        outputs.append(_padded_graphs_sdpa(*sliced, ptr, key_ptr, block, scale, dropout_p))
    return torch.cat(outputs)


def _rows_by_graph(starts: Tensor, sizes: Tensor, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
    """Graphs of ``sizes`` rows from ``starts``: per row its graph, its position in it and the row itself."""
    graph = torch.repeat_interleave(torch.arange(sizes.numel()), sizes)
    position = torch.arange(graph.numel()) - (sizes.cumsum(0) - sizes)[graph]
    return graph.to(device), position.to(device), (starts[graph] + position).to(device)


def _padded_graphs_sdpa(
    query: Tensor, key: Tensor, value: Tensor, ptr: Tensor, key_ptr: Tensor, block: GraphBlock,
    scale: float | None, dropout_p: float,
) -> Tensor:
    """SDPA over the graphs of one block, each its own batch entry padded with zeros (as
    :func:`_padded_sdpa`). Graphs with queries but no keys are left out (SDPA over no keys is NaN): output 0.
    """
    starts, sizes = ptr[:-1] - block.start, ptr[1:] - ptr[:-1]
    key_starts, key_sizes = key_ptr[:-1] - block.key_start, key_ptr[1:] - key_ptr[:-1]
    inside = (starts >= 0) & (starts + sizes <= query.shape[0]) & (key_starts >= 0)
    inside &= key_starts + key_sizes <= key.shape[0]
    active = inside & (sizes > 0) & (key_sizes > 0)
    out = value.new_zeros(query.shape[0], value.shape[1], value.shape[2])
    if not bool(active.any()):
        return out
    graph, position, rows = _rows_by_graph(starts[active], sizes[active], query.device)
    key_graph, key_position, key_rows = _rows_by_graph(key_starts[active], key_sizes[active], query.device)
    width, key_width = int(sizes[active].max()), int(key_sizes[active].max())

    def padded(tensor: Tensor, graph: Tensor, position: Tensor, width: int) -> Tensor:
        out = tensor.new_zeros(int(active.sum()), width, *tensor.shape[1:])
        out[graph, position] = tensor
        return out.transpose(1, 2)  # [G, H, n_max, d]

    # Padding keys are masked (no mask where no graph is padded: SDPA's memory-efficient kernels then
    # serve); padding queries see their graph's keys (never none) and are dropped.
    mask = None
    if bool((key_sizes[active] < key_width).any()):
        mask = (torch.arange(key_width) < key_sizes[active][:, None]).to(query.device)[:, None, None, :]
    attended = F.scaled_dot_product_attention(
        padded(query[rows], graph, position, width),
        padded(key[key_rows], key_graph, key_position, key_width),
        padded(value[key_rows], key_graph, key_position, key_width),
        attn_mask=mask, dropout_p=dropout_p, scale=scale,
    )
    out[rows] = attended.transpose(1, 2)[graph, position]
    return out


def full_attention_topk(
    query: Tensor, key: Tensor, k: int, *, ptr: Tensor | None = None, batch: Tensor | None = None,
    scale: float | None = None, check_finite: bool = True,
) -> AttentionSelection:
    r"""The k largest weights of full softmax attention per query and head, and the mass they carry.

    Softmax is monotone in the score, so the k largest weights belong to the exact top-k keys of
    :func:`kmipgt.ops.topk_inner_product`. Their full-softmax weights are
    :math:`\exp(s\, q_i \cdot k_j - \mathrm{LSE}_i)` with the per-query log-sum-exp over all keys of the
    graph, computed tile by tile (memory ``O(N·H·k)`` plus a bounded score tile, never ``N×N``).

    Args:
        query: ``[N, H, d]``. key: ``[N, H, d]``.
        k: weights kept per query (``>= 1``).
        ptr / batch: the ragged graphs, as in :func:`kmip_attention`.
        scale: logit scale, default ``1/sqrt(d)``.
        check_finite: raise ValueError on a NaN or inf in query or key, as in :func:`kmip_attention`.

    Returns:
        :class:`AttentionSelection` with ``weight`` renormalised over the k kept keys (sums to 1) and
        ``mass`` ``[N, H]`` = the full-softmax weight those k keys carry (1 when k covers the graph).
    """
    ptr, _ = checked_layout(query, key, None, k, ptr, batch, scale, 0.0, check_finite)
    if query.shape[0] == 0:
        selection = empty_selection(query)
        return selection._replace(mass=query.new_empty(0, query.shape[1]))
    k = min(k, int((ptr[1:] - ptr[:-1]).max()))
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    with torch.no_grad():
        scores, index = topk_inner_product(query, key, k, ptr=ptr, check_finite=False)
        # Recomputed in float32 for half inputs: their returned scores saturate beyond the half range.
        logits = gathered_dot(query, key, index.clamp(min=0)).masked_fill(index < 0, float("-inf")) * scale
        full = torch.exp(logits - _blockwise_logsumexp(query, key, ptr, scale)[..., None])
        mass = full.sum(-1)
    return AttentionSelection(index, scores, torch.softmax(logits, dim=-1), mass)


def _blockwise_logsumexp(query: Tensor, key: Tensor, ptr: Tensor, scale: float) -> Tensor:
    """``[N, H]`` log Σ_j exp(s q_i·k_j) over the keys j of i's graph, one bounded score tile at a time."""
    num_nodes, heads, _ = query.shape
    accumulate = accumulate_dtype(query)
    out = torch.full((num_nodes, heads), float("-inf"), dtype=accumulate, device=query.device)
    lo, hi = node_graph_bounds(ptr, query.device)
    query_h, key_h = query.transpose(0, 1).to(accumulate), key.transpose(0, 1).to(accumulate)
    for block in graph_blocks(ptr, MIN_BLOCK_NODES):
        key_tile = min(block.end - block.start, _LSE_KEY_TILE)
        query_tile = max(1, _LSE_TILE_ELEMENTS // (heads * key_tile))
        for q0 in range(block.start, block.end, query_tile):
            q1 = min(q0 + query_tile, block.end)
            for k0 in range(block.start, block.end, key_tile):
                k1 = min(k0 + key_tile, block.end)
                logits = torch.matmul(query_h[:, q0:q1], key_h[:, k0:k1].transpose(1, 2)) * scale
                if block.multi:
                    keys = torch.arange(k0, k1, device=query.device)
                    same_graph = (keys >= lo[q0:q1, None]) & (keys < hi[q0:q1, None])
                    logits.masked_fill_(~same_graph, float("-inf"))
                tile = torch.logsumexp(logits, dim=-1).transpose(0, 1)
                out[q0:q1] = torch.logaddexp(out[q0:q1], tile)
    return out
