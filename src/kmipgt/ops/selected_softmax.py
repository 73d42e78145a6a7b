"""Softmax attention restricted to given keys per query and head: the search-then-gather path of k-MIP
attention, forward and backward, saving only ``O(N·H·k)``.

The gathered ``[N, H, k, d]`` keys and values are computed chunk by chunk (:mod:`kmipgt.ops.gathers`) in
both passes instead of being kept for the backward, which is what makes training memory linear in N.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.ops.gathers import gathered_dot, gathered_sum, scatter_rows
from kmipgt.ops.ragged import node_graph_bounds

__all__ = ["padding_rows", "selected_softmax_backward", "selected_softmax_forward"]


def padding_rows(ptr: Tensor, key_ptr: Tensor | None, num_queries: int, num_keys: int, device) -> Tensor:
    """``[M]`` key row that padding slots gather: the query's own row, or the first key of its graph.

    Padding slots (graphs smaller than k) get weight 0, but 0·NaN is NaN, so a row of another graph (e.g.
    row 0) would leak an unchecked NaN into this graph. A graph without keys has none of its own; it gets
    a row in range, whose weight is 0 all the same.
    """
    if key_ptr is None:
        return torch.arange(num_queries, device=device)
    return node_graph_bounds(ptr, device, key_ptr)[0].clamp(max=num_keys - 1)


def selected_softmax_forward(
    query: Tensor, key: Tensor, value: Tensor, index: Tensor, pad_row: Tensor, scale: float, dropout_p: float
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``out [M, H, d_v]`` (value dtype), softmax ``weight [M, H, k]`` over the selected keys (before
    dropout; 0 at padding) and the dropout's ``keep`` mask (None without dropout).

    ``index`` ``[M, H, k]`` holds key rows, ``-1`` at padding; ``pad_row`` ``[M]`` (:func:`padding_rows`).
    Half-precision inputs get a float32 softmax; float64 stays float64. A query whose graph has no keys
    has no valid slot: it attends to nothing (output 0).
    """
    valid = index >= 0
    safe = torch.where(valid, index, pad_row[:, None, None])
    logits = gathered_dot(query, key, safe) * scale
    logits.masked_fill_(~valid, float("-inf"))
    weights = torch.softmax(logits, dim=-1).masked_fill(~valid, 0.0)
    keep = None
    dropped = weights
    if dropout_p > 0:
        keep = torch.rand_like(weights) >= dropout_p
        dropped = weights * keep / (1.0 - dropout_p)
    return gathered_sum(dropped.to(value.dtype), value, safe), weights, keep


def selected_softmax_backward(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, index: Tensor, pad_row: Tensor,
    weights: Tensor, keep: Tensor | None, scale: float, dropout_p: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`selected_softmax_forward` with respect to query, key and value, from its
    ``weights`` and ``keep``; the selection itself passes no gradient."""
    safe = torch.where(index >= 0, index, pad_row[:, None, None])
    dropped = weights if keep is None else weights * keep / (1.0 - dropout_p)
    grad_dropped = gathered_dot(grad_out, value, safe)
    grad_weights = grad_dropped if keep is None else grad_dropped * keep / (1.0 - dropout_p)
    grad_logits = weights * (grad_weights - (weights * grad_weights).sum(-1, keepdim=True)) * scale
    grad_logits = grad_logits.to(query.dtype)
    num_keys = key.shape[0]
    grad_query = gathered_sum(grad_logits, key, safe)
    grad_key = scatter_rows(grad_logits, query, safe, num_keys)
    grad_value = scatter_rows(dropped.to(grad_out.dtype), grad_out, safe, num_keys)
    return grad_query, grad_key, grad_value
