"""Hop distances in the undirected input graph, capped: from each query to the keys it attends to.

Explaining attention over a whole split asks for ``Q × (heads · k)`` query-key distances per layer
(8,000 queries × 64 keys × 8 layers on a 10k-node city). One capped BFS per query that stops as soon as
all of that query's targets are found does it in a compiled loop (numba); without numba, scipy's
``dijkstra(unweighted=True, limit=cap)`` computes the same distances to every node, chunk by chunk.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import dijkstra

from kmipgt.data.ball_kernel import bfs_expand

try:
    import numba
except ImportError:  # the scipy path below is used instead
    numba = None

__all__ = ["HOP_CAP", "ball", "hop_distance_blocks", "hop_distances", "undirected_adjacency"]

HOP_CAP = 64
# Distance-matrix elements per scipy call ([sources, N] float64), which bounds its memory to 64 MB.
_SCIPY_ELEMENTS = 1 << 23


def undirected_adjacency(edge_index: torch.Tensor, num_nodes: int) -> sp.csr_matrix:
    """``[N, N]`` CSR adjacency (int64 indices) with every edge in both directions, duplicates merged."""
    src, dst = edge_index.detach().cpu().numpy().astype(np.int64)
    ones = np.ones(2 * src.size, dtype=np.int8)
    rows, cols = np.concatenate([src, dst]), np.concatenate([dst, src])
    adjacency = sp.csr_matrix((ones, (rows, cols)), shape=(num_nodes, num_nodes))
    adjacency.sum_duplicates()
    adjacency.indptr = adjacency.indptr.astype(np.int64)
    adjacency.indices = adjacency.indices.astype(np.int64)
    return adjacency


def _capped_hops(indptr, indices, sources, targets, cap):
    """``[Q, T]`` BFS hops from ``sources[q]`` to ``targets[q, t]``; -1 beyond ``cap``/unreachable/padding."""
    num_nodes = indptr.size - 1
    hop = np.full(num_nodes, -1, dtype=np.int64)
    wanted = np.full(num_nodes, -1, dtype=np.int64)  # wanted[v] == q: v is a target of query q
    queue = np.empty(num_nodes, dtype=np.int64)
    out = np.full(targets.shape, -1, dtype=np.int64)
    for q in range(sources.size):
        remaining = 0
        for t in range(targets.shape[1]):
            node = targets[q, t]
            if node >= 0 and wanted[node] != q:
                wanted[node] = q
                remaining += 1
        source = sources[q]
        hop[source] = 0
        if wanted[source] == q:
            remaining -= 1
        queue[0] = source
        head, tail = 0, 1
        # BFS order: once a node at the cap is dequeued, no later node can be closer than the cap.
        while head < tail and remaining > 0 and hop[queue[head]] < cap:
            u = queue[head]
            head += 1
            start, tail = tail, bfs_expand(u, indptr, indices, hop, queue, tail)
            for i in range(start, tail):
                if wanted[queue[i]] == q:
                    remaining -= 1
        for t in range(targets.shape[1]):
            node = targets[q, t]
            if node >= 0:
                out[q, t] = hop[node]
        for i in range(tail):
            hop[queue[i]] = -1
    return out


if numba is not None:
    _capped_hops = numba.njit(cache=True, nogil=True)(_capped_hops)


def hop_distance_blocks(
    adjacency: sp.csr_matrix, sources: np.ndarray, cap: int
) -> Iterator[tuple[slice, np.ndarray]]:
    """``(rows, hops)`` per block of ``sources [Q]``: ``hops [len(rows), N]`` float64 hop counts from
    ``sources[rows]`` to every node, ``inf`` beyond ``cap`` or unreachable; blocks of at most ``2**23``
    elements, so memory stays bounded however many sources there are."""
    step = max(1, _SCIPY_ELEMENTS // max(1, adjacency.shape[0]))
    for start in range(0, sources.size, step):
        rows = slice(start, start + step)
        yield rows, dijkstra(adjacency, unweighted=True, indices=sources[rows], limit=cap)


def _scipy_hops(adjacency: sp.csr_matrix, sources: np.ndarray, targets: np.ndarray, cap: int) -> np.ndarray:
    out = np.full(targets.shape, -1, dtype=np.int64)
    for rows, dist in hop_distance_blocks(adjacency, sources, cap):
        found = np.take_along_axis(dist, np.maximum(targets[rows], 0), axis=1)
        out[rows] = np.where(np.isfinite(found) & (targets[rows] >= 0), found, -1)
    return out


def hop_distances(
    adjacency: sp.csr_matrix, sources: np.ndarray, targets: np.ndarray, cap: int = HOP_CAP
) -> np.ndarray:
    """Shortest-path hop counts from each source to its own targets, capped.

    Args:
        adjacency: ``[N, N]`` CSR of the undirected graph (:func:`undirected_adjacency`).
        sources: ``[Q]`` node ids.
        targets: ``[Q, T]`` node ids per source; negative entries are padding.
        cap: largest hop count reported.

    Returns:
        ``[Q, T]`` int64 hops; ``-1`` where the target is farther than ``cap``, unreachable, or padding.
    """
    sources = np.ascontiguousarray(sources, dtype=np.int64)
    targets = np.ascontiguousarray(targets, dtype=np.int64).reshape(sources.size, -1)
    if numba is None:
        return _scipy_hops(adjacency, sources, targets, cap)
    return _capped_hops(adjacency.indptr, adjacency.indices, sources, targets, cap)


def ball(adjacency: sp.csr_matrix, node: int, radius: int) -> np.ndarray:
    """Sorted ``[M]`` ids of the nodes within ``radius`` hops of ``node`` (itself included)."""
    dist = dijkstra(adjacency, unweighted=True, indices=node, limit=radius)
    return np.flatnonzero(np.isfinite(dist))
