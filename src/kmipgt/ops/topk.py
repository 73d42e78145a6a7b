"""Exact top-k inner-product search over ragged graphs without an N×N score matrix."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from kmipgt.ops.ragged import graph_blocks, graph_ptr, node_graph_bounds

__all__ = ["SEARCH_BACKENDS", "topk_inner_product"]

Backend = Literal["auto", "torch", "dense", "keops"]
SEARCH_BACKENDS: tuple[str, ...] = ("auto", "torch", "dense", "keops")

# Small graphs are searched together (masked) so a batch of many molecules is a few matmuls.
MIN_BLOCK_NODES = 512
# Working-set bounds of the blockwise search, in score elements: a query tile times a key tile.
# Measured on a 2-core CPU: 64 MB tiles beat 4-16 MB ones (fewer topk/merge passes); on GPU larger
# tiles amortise kernel launches.
_TILE_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 26}
_KEY_TILE = {"cpu": 1 << 15, "cuda": 1 << 16}


def check_query_key(query: Tensor, key: Tensor, k: int) -> None:
    """Raise TypeError/ValueError unless query/key are matching [N, H, d] floats and k >= 1."""
    for name, tensor in (("query", query), ("key", key)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.dtype.is_floating_point:
            raise TypeError(f"`{name}` must be a floating-point tensor, got dtype {tensor.dtype}")
        if tensor.dim() != 3:
            raise ValueError(f"`{name}` must have shape [N, H, d], got {tuple(tensor.shape)}")
    if query.shape != key.shape:
        raise ValueError(
            f"`query` and `key` must have the same shape [N, H, d], got {tuple(query.shape)} and "
            f"{tuple(key.shape)}"
        )
    if query.dtype != key.dtype or query.device != key.device:
        raise TypeError("`query` and `key` must share dtype and device")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"`k` must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"`k` must be >= 1, got {k}")


def topk_inner_product(
    query: Tensor,
    key: Tensor,
    k: int,
    *,
    ptr: Tensor | None = None,
    batch: Tensor | None = None,
    backend: Backend = "auto",
) -> tuple[Tensor, Tensor]:
    r"""The k keys of largest inner product with each query, within the query's own graph.

    For query :math:`i` of graph :math:`g`, returns :math:`T_k(i) = \operatorname{argtop-}k_{j \in g}\,
    q_i \cdot k_j`, exactly, ordered by decreasing score with ties broken by lower key index.

    Args:
        query: ``[N, H, d]`` queries, node-major (PyG layout), H heads.
        key: ``[N, H, d]`` keys.
        k: number of keys per query (``>= 1``).
        ptr: ``[G + 1]`` CSR offsets of the graphs (``Batch.ptr``).
        batch: ``[N]`` sorted graph id per node (``Batch.batch``). Neither: one graph.
        backend: ``"torch"`` (blockwise matmul + top-k, memory ``O(N·H·k)`` plus a bounded tile),
            ``"dense"`` (one score matrix per block of graphs; for tests and small inputs),
            ``"keops"`` (pykeops ``argKmin``; needs the ``keops`` extra), ``"auto"`` (= ``"torch"``).

    Returns:
        ``(scores, index)``: ``[N, H, k]`` scores in the query dtype and ``[N, H, k]`` int64 global key
        indices. Where a graph has fewer than k nodes the trailing slots hold index ``-1`` and
        score ``-inf``.
    """
    check_query_key(query, key, k)
    ptr = graph_ptr(query.shape[0], ptr=ptr, batch=batch)
    if backend in ("auto", "torch"):
        device = query.device.type if query.device.type in _TILE_ELEMENTS else "cuda"
        return _topk_blockwise(query, key, k, ptr, _TILE_ELEMENTS[device], _KEY_TILE[device])
    if backend == "dense":
        return _topk_blockwise(query, key, k, ptr, tile_elements=None, key_tile=None)
    if backend == "keops":
        from kmipgt.ops.keops_search import topk_keops

        return topk_keops(query, key, k, ptr)
    raise ValueError(f"`backend` must be one of {SEARCH_BACKENDS}, got {backend!r}")


def sort_by_score_then_index(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Order the last axis by decreasing score, ties by increasing index (two stable sorts)."""
    order = index.argsort(dim=-1, stable=True)
    scores, index = scores.gather(-1, order), index.gather(-1, order)
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return scores.gather(-1, order), index.gather(-1, order)


def _tile_topk(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k positions along the last axis; a tie at the k-th place goes to the lower position.

    ``torch.topk`` leaves the choice among tied scores unspecified, so rows where the k-th and
    (k+1)-th scores are equal are redone with a stable sort; such rows are rare for float data.
    """
    width = scores.shape[-1]
    if k >= width:
        return scores.sort(dim=-1, descending=True, stable=True)
    values, positions = scores.topk(k + 1, dim=-1)
    tied = values[..., k - 1] == values[..., k]
    values, positions = values[..., :k], positions[..., :k]
    if bool(tied.any()):
        rows = tied.nonzero(as_tuple=True)
        exact_values, exact_positions = scores[rows].sort(dim=-1, descending=True, stable=True)
        values[rows], positions[rows] = exact_values[..., :k], exact_positions[..., :k]
    return values, positions


def _merge_topk(best: tuple[Tensor, Tensor], new: tuple[Tensor, Tensor], k: int) -> tuple[Tensor, Tensor]:
    scores, index = sort_by_score_then_index(
        torch.cat([best[0], new[0]], -1), torch.cat([best[1], new[1]], -1)
    )
    return scores[..., :k], index[..., :k]


def _topk_blockwise(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, tile_elements: int | None, key_tile: int | None
) -> tuple[Tensor, Tensor]:
    num_nodes, heads, _ = query.shape
    scores_out = query.new_full((num_nodes, heads, k), float("-inf"))
    index_out = torch.full((num_nodes, heads, k), -1, dtype=torch.long, device=query.device)
    lo, hi = node_graph_bounds(ptr, query.device)
    query_h, key_h = query.transpose(0, 1), key.transpose(0, 1)
    blocks = graph_blocks(ptr, MIN_BLOCK_NODES)
    for block in blocks:
        size = block.end - block.start
        kt = size if key_tile is None else min(size, key_tile)
        qt = size if tile_elements is None else max(1, tile_elements // (heads * kt))
        for q0 in range(block.start, block.end, qt):
            q1 = min(q0 + qt, block.end)
            best = None
            for k0 in range(block.start, block.end, kt):
                k1 = min(k0 + kt, block.end)
                scores = torch.matmul(query_h[:, q0:q1], key_h[:, k0:k1].transpose(1, 2))
                if block.multi:
                    keys = torch.arange(k0, k1, device=query.device)
                    same_graph = (keys >= lo[q0:q1, None]) & (keys < hi[q0:q1, None])
                    scores.masked_fill_(~same_graph, float("-inf"))
                values, positions = _tile_topk(scores, k)
                tile = (values, positions + k0)
                best = tile if best is None else _merge_topk(best, tile, k)
            values, index = sort_by_score_then_index(*best)
            width = values.shape[-1]
            scores_out[q0:q1, :, :width] = values.transpose(0, 1)
            index_out[q0:q1, :, :width] = index.transpose(0, 1)
    if any(block.multi for block in blocks):
        foreign = (index_out < lo[:, None, None]) | (index_out >= hi[:, None, None])
        index_out.masked_fill_(foreign, -1)
        scores_out.masked_fill_(foreign, float("-inf"))
    return scores_out, index_out
