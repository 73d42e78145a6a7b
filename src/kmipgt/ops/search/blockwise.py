"""Exact blockwise top-k search in torch (``matmul`` + ``topk`` with a running merge) and its tie rules.

Shared by the ``torch``/``dense`` backends, the ``fused`` backend (its fallback without a compiler) and the
approximate backends (tile top-k and the final (score, index) order of their candidates).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.ops.ragged import graph_blocks, node_graph_bounds

__all__ = ["MIN_BLOCK_NODES", "sort_by_score_then_index", "tile_topk", "topk_blockwise", "topk_tiled"]

# Small graphs are searched together (masked) so a batch of many molecules is a few matmuls.
MIN_BLOCK_NODES = 512
# Working-set bounds of the blockwise search, in score elements: a query tile times a key tile.
# Measured on a 2-core CPU: 64 MB tiles beat 4-16 MB ones (fewer topk/merge passes); on GPU larger
# tiles amortise kernel launches.
_TILE_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 26}
_KEY_TILE = {"cpu": 1 << 15, "cuda": 1 << 16}


def sort_by_score_then_index(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Order the last axis by decreasing score, ties by increasing index (two stable sorts)."""
    order = index.argsort(dim=-1, stable=True)
    scores, index = scores.gather(-1, order), index.gather(-1, order)
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return scores.gather(-1, order), index.gather(-1, order)


def tile_topk(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
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


def topk_tiled(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, *, key_ptr: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`topk_blockwise` with the device's tile bounds: memory ``O(M·H·k)`` plus one bounded tile."""
    device = query.device.type if query.device.type in _TILE_ELEMENTS else "cuda"
    return topk_blockwise(query, key, k, ptr, _TILE_ELEMENTS[device], _KEY_TILE[device], key_ptr=key_ptr)


def topk_blockwise(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, tile_elements: int | None, key_tile: int | None,
    *, key_ptr: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Exact top-k keys per query within its graph, a block of graphs and a tile of queries at a time.

    Args:
        query: ``[M, H, d]`` queries. key: ``[N, H, d]`` keys. k: keys per query (``>= 1``).
        ptr: ``[G + 1]`` validated CSR offsets of the queries' graphs.
        tile_elements: score elements per (query tile × key tile); ``None``: a whole block at once.
        key_tile: keys per key tile; ``None``: a whole block (backend ``"dense"`` passes both ``None``).
        key_ptr: ``[G + 1]`` offsets of the keys' graphs; default ``ptr`` (``M == N``).

    Returns:
        ``(scores, index)``: ``[M, H, k]`` descending scores (query dtype) and int64 global key indices,
        ties broken by lower index; ``-inf``/``-1`` beyond the size of the query's key graph.
    """
    num_queries, heads, _ = query.shape
    scores_out = query.new_full((num_queries, heads, k), float("-inf"))
    index_out = torch.full((num_queries, heads, k), -1, dtype=torch.long, device=query.device)
    lo, hi = node_graph_bounds(ptr, query.device, key_ptr)
    # Half types are ranked in float32 like the fused and Triton kernels do: a float16 product overflows
    # at 65,504 and ties every large score at inf, which would select by index instead of by score.
    rank_dtype = torch.promote_types(query.dtype, torch.float32)
    query_h, key_h = query.transpose(0, 1).to(rank_dtype), key.transpose(0, 1).to(rank_dtype)
    blocks = graph_blocks(ptr, MIN_BLOCK_NODES, key_ptr)
    for block in blocks:
        size, key_size = block.end - block.start, block.key_end - block.key_start
        if size == 0 or key_size == 0:  # queries without keys keep -inf/-1; keys without queries: nothing
            continue
        kt = key_size if key_tile is None else min(key_size, key_tile)
        qt = size if tile_elements is None else max(1, tile_elements // (heads * kt))
        for q0 in range(block.start, block.end, qt):
            q1 = min(q0 + qt, block.end)
            best = None
            for k0 in range(block.key_start, block.key_end, kt):
                k1 = min(k0 + kt, block.key_end)
                scores = torch.matmul(query_h[:, q0:q1], key_h[:, k0:k1].transpose(1, 2))
                if block.multi:
                    keys = torch.arange(k0, k1, device=query.device)
                    same_graph = (keys >= lo[q0:q1, None]) & (keys < hi[q0:q1, None])
                    scores.masked_fill_(~same_graph, float("-inf"))
                values, positions = tile_topk(scores, k)
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
