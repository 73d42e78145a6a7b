"""Compiled (numba) kernel for the ball eccentricities of :mod:`kmipgt.data.city_labels`.

Why our own kernel: the scipy path spends most of its ~1 ms per node in per-call overhead (a dozen small
numpy calls per BFS layer, building a CSR matrix, validating it in ``dijkstra``), not in the search itself.
This kernel runs the same bounded BFS and a binary-heap Dijkstra restricted to the ball in one compiled
loop, with scratch arrays reset per node, so a node costs O(ball log ball). The results equal the scipy
path (tests compare them); it is used when numba is installed (optional extra ``fast``).
"""

from __future__ import annotations

import numpy as np

try:
    import numba
except ImportError:  # the scipy path in city_labels is used instead
    numba = None


def bfs_expand(u: int, indptr: np.ndarray, indices: np.ndarray, hop: np.ndarray, queue: np.ndarray,
               tail: int) -> int:
    """One BFS step: append ``u``'s unvisited neighbours to ``queue`` at ``hop[u] + 1``; the new tail.

    Shared by the bounded BFS here and the capped hop distances of :mod:`kmipgt.analysis.hops`.
    """
    for p in range(indptr[u], indptr[u + 1]):
        v = indices[p]
        if hop[v] < 0:
            hop[v] = hop[u] + 1
            queue[tail] = v
            tail += 1
    return tail


def _heap_push(keys: np.ndarray, items: np.ndarray, size: int, key: float, item: int) -> int:
    i = size
    keys[i], items[i] = key, item
    while i > 0:
        parent = (i - 1) // 2
        if keys[parent] <= keys[i]:
            break
        keys[parent], keys[i] = keys[i], keys[parent]
        items[parent], items[i] = items[i], items[parent]
        i = parent
    return size + 1


def _heap_pop(keys: np.ndarray, items: np.ndarray, size: int) -> int:
    """Move the last entry to the root and sift it down; the caller read the root before. Returns new size."""
    size -= 1
    keys[0], items[0] = keys[size], items[size]
    i = 0
    while True:
        left, smallest = 2 * i + 1, i
        if left < size and keys[left] < keys[smallest]:
            smallest = left
        if left + 1 < size and keys[left + 1] < keys[smallest]:
            smallest = left + 1
        if smallest == i:
            return size
        keys[smallest], keys[i] = keys[i], keys[smallest]
        items[smallest], items[i] = items[i], items[smallest]
        i = smallest


def _ball_eccentricities(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, nodes: np.ndarray,
                         hops: int) -> np.ndarray:
    """Eccentricity ``[len(nodes)]`` of each node within its ``hops``-hop ball (induced subgraph)."""
    num_nodes = indptr.size - 1
    hop = np.full(num_nodes, -1, dtype=np.int64)
    dist = np.full(num_nodes, np.inf)
    settled = np.zeros(num_nodes, dtype=np.bool_)
    queue = np.empty(num_nodes, dtype=np.int64)
    heap_keys = np.empty(indices.size + 1, dtype=np.float64)
    heap_items = np.empty(indices.size + 1, dtype=np.int64)
    out = np.empty(nodes.size, dtype=np.float64)
    for t in range(nodes.size):
        source = nodes[t]
        hop[source] = 0
        queue[0] = source
        head, tail = 0, 1
        while head < tail:
            u = queue[head]
            head += 1
            if hop[u] < hops:
                tail = bfs_expand(u, indptr, indices, hop, queue, tail)
        dist[source] = 0.0
        size = _heap_push(heap_keys, heap_items, 0, 0.0, source)
        eccentricity = 0.0
        while size > 0:
            d, u = heap_keys[0], heap_items[0]
            size = _heap_pop(heap_keys, heap_items, size)
            if settled[u]:
                continue
            settled[u] = True
            eccentricity = d  # Dijkstra settles nodes in non-decreasing distance
            for p in range(indptr[u], indptr[u + 1]):
                v = indices[p]
                if hop[v] >= 0 and not settled[v]:
                    candidate = d + weights[p]
                    if candidate < dist[v]:
                        dist[v] = candidate
                        size = _heap_push(heap_keys, heap_items, size, candidate, v)
        out[t] = eccentricity
        for i in range(tail):
            node = queue[i]
            hop[node], dist[node], settled[node] = -1, np.inf, False
    return out


if numba is not None:
    bfs_expand = numba.njit(cache=True, nogil=True)(bfs_expand)
    _heap_push = numba.njit(cache=True, nogil=True)(_heap_push)
    _heap_pop = numba.njit(cache=True, nogil=True)(_heap_pop)
    _ball_eccentricities = numba.njit(cache=True, nogil=True)(_ball_eccentricities)


def compiled_ball_eccentricities(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray,
                                 nodes: np.ndarray, hops: int) -> np.ndarray:
    """The numba kernel (int64 CSR arrays, float64 weights); ImportError when numba is missing."""
    if numba is None:
        raise ImportError("backend='numba' needs numba: pip install numba")
    return _ball_eccentricities(indptr, indices, weights, nodes, hops)
