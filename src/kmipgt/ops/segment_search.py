"""Exact top-k search over segments: the queries of segment s search only the keys of segment s.

This generalises the per-graph search to different query and key offsets, which the inverted-file
index needs (segment = one inverted list, its queries = those that probe it). It dispatches to the
fastest exact kernel for the device: the fused C++ kernel on CPU, the Triton kernel on CUDA, and a
loop of ``matmul`` + ``topk`` everywhere else.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.ops.fused_search import FUSED_DTYPES, fused_library, topk_fused

__all__ = ["exact_topk_rows", "segment_topk", "segment_topk_torch", "sort_by_score_then_index"]

# Score elements per matmul in the torch loop: bounds its transient memory (64 MiB in float32).
_SCORE_ELEMENTS = 1 << 24


def sort_by_score_then_index(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Order the last axis by decreasing score, ties by increasing index (two stable sorts)."""
    order = index.argsort(dim=-1, stable=True)
    scores, index = scores.gather(-1, order), index.gather(-1, order)
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return scores.gather(-1, order), index.gather(-1, order)


def exact_topk_rows(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Top-k positions along the last axis, descending, ties (also at the k-th place) to the lower position.

    ``torch.topk`` leaves the choice among tied scores unspecified, so rows where the k-th and
    (k+1)-th scores tie are redone with a stable sort; such rows are rare for float data.
    """
    if k >= scores.shape[-1]:
        return scores.sort(dim=-1, descending=True, stable=True)
    values, positions = scores.topk(k + 1, dim=-1)
    tied = values[..., k - 1] == values[..., k]
    values, positions = sort_by_score_then_index(values[..., :k], positions[..., :k])
    if bool(tied.any()):
        rows = tied.nonzero(as_tuple=True)
        exact_values, exact_positions = scores[rows].sort(dim=-1, descending=True, stable=True)
        values[rows], positions[rows] = exact_values[..., :k], exact_positions[..., :k]
    return values, positions


def segment_topk_torch(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, key_ptr: Tensor
) -> tuple[Tensor, Tensor]:
    """Reference loop over segments with ``matmul`` + exact top-k; any device and dtype.

    Shapes as :func:`segment_topk`. One Python iteration per non-empty segment and query chunk.
    """
    num_queries, heads, _ = query.shape
    scores_out = query.new_full((num_queries, heads, k), float("-inf"))
    index_out = torch.full((num_queries, heads, k), -1, dtype=torch.long, device=query.device)
    bounds = zip(ptr[:-1].tolist(), ptr[1:].tolist(), key_ptr[:-1].tolist(), key_ptr[1:].tolist())
    for q0, q1, k0, k1 in bounds:
        if q1 == q0 or k1 == k0:
            continue
        keys_t = key[k0:k1].transpose(0, 1).transpose(1, 2)
        chunk = max(1, _SCORE_ELEMENTS // (heads * (k1 - k0)))
        for c0 in range(q0, q1, chunk):
            c1 = min(q1, c0 + chunk)
            scores = torch.matmul(query[c0:c1].transpose(0, 1), keys_t)
            values, positions = exact_topk_rows(scores, min(k, k1 - k0))
            width = values.shape[-1]
            scores_out[c0:c1, :, :width] = values.transpose(0, 1)
            index_out[c0:c1, :, :width] = positions.transpose(0, 1) + k0
    return scores_out, index_out


def _triton_ready(query: Tensor) -> bool:
    if query.device.type != "cuda":
        return False
    from kmipgt.ops.triton_search import triton_available

    return triton_available()


def segment_topk(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, key_ptr: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Exact top-k keys of each query among the keys of its own segment, with the fastest kernel here.

    Args:
        query: ``[M, H, d]`` queries.
        key: ``[N, H, d]`` keys (same dtype and device).
        k: keys per query (``>= 1``).
        ptr: ``[S + 1]`` CSR offsets of the query segments (CPU, validated).
        key_ptr: ``[S + 1]`` CSR offsets of the key segments; ``None`` means ``ptr``.

    Returns:
        ``(scores, index)``: ``[M, H, k]`` descending scores and int64 key rows, ties to the lower row,
        ``-inf``/``-1`` beyond a segment's key count.
    """
    key_ptr = ptr if key_ptr is None else key_ptr
    if query.device.type == "cpu" and query.dtype in FUSED_DTYPES and fused_library() is not None:
        return topk_fused(query, key, k, ptr, key_ptr)
    if _triton_ready(query):
        from kmipgt.ops.triton_search import topk_triton

        return topk_triton(query, key, k, ptr, key_ptr)
    return segment_topk_torch(query, key, k, ptr, key_ptr)
