"""Backends ``"torch"`` (tiled ``matmul`` + ``topk``) and ``"dense"`` (one score matrix per block of graphs).

Both run the exact blockwise search of :mod:`kmipgt.ops.search.blockwise` on any device and dtype.
"""

from __future__ import annotations

from torch import Tensor

from kmipgt.ops.search.blockwise import topk_blockwise, topk_tiled
from kmipgt.ops.search.registry import SearchBackend, register

__all__ = ["topk_dense"]


def topk_dense(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, *, key_ptr: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Exact search with one ``[H, B, B']`` score matrix per block of graphs (for tests and small inputs).

    ``[M, H, d]`` query, ``[N, H, d]`` key, ``[G + 1]`` ptr and key_ptr (default ptr) -> ``[M, H, k]`` scores
    and int64 global key indices.
    """
    return topk_blockwise(query, key, k, ptr, tile_elements=None, key_tile=None, key_ptr=key_ptr)


# `auto`'s last resort: it takes every device and dtype and needs nothing optional.
register(SearchBackend(
    name="torch", search=topk_tiled, exact=True, available=lambda: True, queries_differ=True, auto_rank=2
))
register(SearchBackend(
    name="dense", search=topk_dense, exact=True, available=lambda: True, queries_differ=True
))
