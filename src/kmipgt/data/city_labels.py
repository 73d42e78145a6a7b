"""City-Networks node labels: road-length eccentricity inside each node's 16-hop ball, cut into equal classes.

Definition (Liang et al. 2025, "City-Networks", arXiv 2503.09008, and their ``dataset_generation`` code):
for every node v, ``ball = k_hop_subgraph(v, hops)`` and ``ecc(v) = max_u dist(v, u)`` with shortest paths
on the subgraph *induced by the ball*, edge weight = road length. Classes come from sorting the
eccentricities ascending and cutting them into chunks of ``n // num_classes + 1`` nodes, so class 0 holds the
smallest eccentricities (the most accessible nodes).

Per node this is a bounded BFS plus one Dijkstra on the ball: scipy ``dijkstra`` on the induced CSR, or the
compiled kernel of :mod:`kmipgt.data.ball_kernel` when numba is installed (same results, ~5x less CPU).
Nodes are independent, so the work is spread over worker processes. The result is cached on disk (see
:mod:`kmipgt.data.cache`).
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from functools import partial

import numpy as np
import scipy.sparse as sp
import torch
from scipy.sparse.csgraph import dijkstra
from tqdm.auto import tqdm

from kmipgt.cpus import capped_at_cpus
from kmipgt.data import ball_kernel, cache
from kmipgt.data.graph_checks import check_edge_index
from kmipgt.logs import quiet

# Graphs below this size are labelled in-process: starting workers costs more than it saves.
_MIN_NODES_FOR_WORKERS = 4096


def road_adjacency(edge_index: np.ndarray, edge_length: np.ndarray, num_nodes: int) -> sp.csr_matrix:
    """Symmetric CSR adjacency ``[num_nodes, num_nodes]`` weighted by road length.

    Edges are read as undirected (each column of ``edge_index [2, E]`` is added in both directions),
    self-loops are dropped and parallel edges keep their shortest length, so scipy never sums two lengths.
    """
    row = np.concatenate([edge_index[0], edge_index[1]])
    col = np.concatenate([edge_index[1], edge_index[0]])
    weight = np.concatenate([edge_length, edge_length])
    keep = row != col
    row, col, weight = row[keep], col[keep], weight[keep]
    pair = row * num_nodes + col
    order = np.lexsort((weight, pair))
    first = np.ones(order.size, dtype=bool)
    first[1:] = pair[order][1:] != pair[order][:-1]
    order = order[first]
    adjacency = sp.csr_matrix((weight[order], (row[order], col[order])), shape=(num_nodes, num_nodes))
    adjacency.sort_indices()
    return adjacency


def _csr_positions(indptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions in ``indices``/``data`` of the entries of ``rows``, row after row."""
    starts = indptr[rows]
    counts = indptr[rows + 1] - starts
    offsets = np.cumsum(counts) - counts
    return np.arange(offsets[-1] + counts[-1], dtype=np.int64) + np.repeat(starts - offsets, counts)


class _BallEccentricity:
    """Eccentricity of nodes within their k-hop balls; holds scratch arrays reused across nodes.

    Per node: a BFS bounded to ``hops`` layers, the CSR of the subgraph induced by the ball (assembled from
    the entries the BFS already gathered), and one scipy Dijkstra from the node. Work per node is vectorised
    numpy; node-indexed scratch arrays are reset after each node, so a node costs O(ball), not O(N).
    """

    def __init__(self, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, hops: int) -> None:
        self.indptr, self.indices, self.data, self.hops = indptr, indices, data, hops
        num_nodes = indptr.size - 1
        self.in_ball = np.zeros(num_nodes, dtype=bool)
        self.local_id = np.zeros(num_nodes, dtype=np.int64)

    def __call__(self, node: int) -> float:
        indptr, indices, in_ball, local_id = self.indptr, self.indices, self.in_ball, self.local_id
        in_ball[node] = True
        layers = [np.array([node], dtype=np.int64)]
        gathered = []  # CSR positions of every ball node's entries, in ball order
        for _ in range(self.hops):
            positions = _csr_positions(indptr, layers[-1])
            gathered.append(positions)
            neighbours = indices[positions]
            neighbours = neighbours[~in_ball[neighbours]]
            if neighbours.size == 0:
                break
            in_ball[neighbours] = True
            # Deduplicate without sorting: keep the last occurrence of each node.
            order = np.arange(neighbours.size)
            local_id[neighbours] = order
            layers.append(neighbours[local_id[neighbours] == order])
        else:
            gathered.append(_csr_positions(indptr, layers[-1]))
        ball = np.concatenate(layers)
        positions = np.concatenate(gathered)
        local_id[ball] = np.arange(ball.size)
        target = indices[positions]
        inside = in_ball[target]
        row_ends = np.cumsum(indptr[ball + 1] - indptr[ball])
        inside_before = np.concatenate([[0], np.cumsum(inside)])
        sub_indptr = np.concatenate([[0], inside_before[row_ends]])
        induced = sp.csr_matrix(
            (self.data[positions[inside]], local_id[target[inside]], sub_indptr), shape=(ball.size, ball.size)
        )
        in_ball[ball] = False
        return float(dijkstra(induced, directed=True, indices=0).max())

    def many(self, nodes: np.ndarray) -> np.ndarray:
        return np.array([self(int(node)) for node in nodes], dtype=np.float64)


BACKENDS = ("auto", "numba", "scipy")


def _resolve_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "numba" if ball_kernel.numba is not None else "scipy"
    return backend


def _chunk_solver(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, hops: int,
                  backend: str) -> Callable[[np.ndarray], np.ndarray]:
    """nodes -> their ball eccentricities, on the chosen backend."""
    if backend == "numba":
        return partial(_compiled_chunk, indptr, indices, data, hops)
    return _BallEccentricity(indptr, indices, data, hops).many


def _compiled_chunk(indptr, indices, data, hops, nodes):
    return ball_kernel.compiled_ball_eccentricities(indptr, indices, data, nodes, hops)


_worker_solver: Callable[[np.ndarray], np.ndarray] | None = None


def _init_worker(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, hops: int, backend: str) -> None:
    global _worker_solver
    _worker_solver = _chunk_solver(indptr, indices, data, hops, backend)


def _worker_chunk(nodes: np.ndarray) -> np.ndarray:
    assert _worker_solver is not None, "worker used before _init_worker"
    return _worker_solver(nodes)


def ball_eccentricity(
    adjacency: sp.csr_matrix,
    hops: int = 16,
    *,
    nodes: np.ndarray | None = None,
    num_workers: int | None = None,
    backend: str = "auto",
    progress: bool = True,
) -> np.ndarray:
    """Road-length eccentricity of ``nodes`` (default: all) in their ``hops``-hop balls: float64 ``[M]``.

    ``adjacency`` is a symmetric CSR matrix from :func:`road_adjacency`. ``num_workers`` processes share the
    work (default, and at most: one per CPU this process may use); a tqdm bar shows progress.
    ``backend``: ``"scipy"`` (numpy BFS + scipy Dijkstra per node), ``"numba"`` (the compiled kernel of
    :mod:`kmipgt.data.ball_kernel`, same results, ~5x less CPU) or ``"auto"`` (numba when installed).
    """
    indptr = adjacency.indptr.astype(np.int64)
    indices = adjacency.indices.astype(np.int64)
    data = adjacency.data.astype(np.float64)
    num_nodes = adjacency.shape[0]
    nodes = np.arange(num_nodes, dtype=np.int64) if nodes is None else np.asarray(nodes, dtype=np.int64)
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    workers = capped_at_cpus(num_workers, "num_workers")
    solver = _chunk_solver(indptr, indices, data, hops, _resolve_backend(backend))
    # Small chunks keep the bar moving and balance load (ball sizes vary a lot across a city).
    chunks = np.array_split(nodes, max(1, nodes.size // 512))
    show = progress and not quiet()
    bar = tqdm(total=nodes.size, desc=f"{hops}-hop eccentricity", unit="node", disable=not show)
    results = []
    if workers == 1 or nodes.size < _MIN_NODES_FOR_WORKERS:
        for chunk in chunks:
            results.append(solver(chunk))
            bar.update(chunk.size)
    else:
        solver(nodes[:1])  # compile (numba) once here; forked workers inherit the machine code
        # fork shares the CSR arrays copy-on-write; workers touch only numpy/scipy/numba, never torch.
        start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        context = multiprocessing.get_context(start_method)
        initargs = (indptr, indices, data, hops, _resolve_backend(backend))
        with context.Pool(workers, initializer=_init_worker, initargs=initargs) as pool:
            for chunk_result in pool.imap(_worker_chunk, chunks):
                results.append(chunk_result)
                bar.update(chunk_result.size)
    bar.close()
    return np.concatenate(results) if results else np.empty(0, dtype=np.float64)


def partition_labels(values: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Equal-size classes by rank, as City-Networks' ``create_partition_labels``: LongTensor ``[n]``.

    Sorted ascending (stable, so ties go by node index), chunks of ``n // num_classes + 1`` nodes get classes
    0, 1, ...; the last class is slightly smaller.
    """
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    values = torch.as_tensor(values)
    n = values.numel()
    order = torch.sort(values, stable=True).indices
    labels = torch.empty(n, dtype=torch.long)
    labels[order] = torch.arange(n) // (n // num_classes + 1)
    return labels


def _check_graph(edge_index, edge_length, num_nodes: int) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(num_nodes, int | np.integer) or num_nodes < 0:
        raise ValueError(f"num_nodes must be a non-negative int, got {num_nodes!r}")
    edge_index = check_edge_index(torch.as_tensor(edge_index).cpu(), int(num_nodes), "edge_index").numpy()
    edge_length = np.asarray(torch.as_tensor(edge_length).cpu(), dtype=np.float64)
    if edge_length.shape != (edge_index.shape[1],):
        raise ValueError(f"edge_length must have shape [E] = ({edge_index.shape[1]},), "
                         f"got {edge_length.shape}")
    if not np.all(np.isfinite(edge_length)) or (edge_length.size and edge_length.min() < 0):
        raise ValueError("edge_length must be finite and >= 0 (road length in metres)")
    return edge_index, edge_length


def eccentricity_labels(
    edge_index: torch.Tensor | np.ndarray,
    edge_length: torch.Tensor | np.ndarray,
    num_nodes: int,
    hops: int = 16,
    num_classes: int = 10,
    *,
    num_workers: int | None = None,
    backend: str = "auto",
    use_cache: bool = True,
    progress: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """City-Networks labels of a road graph.

    Args:
        edge_index: ``[2, E]`` integer edges, read as undirected (either or both directions may be given).
        edge_length: ``[E]`` road length of each column of ``edge_index`` (metres).
        num_nodes: number of nodes ``N``.
        hops: radius of the ball in hops (City-Networks: 16).
        num_classes: number of equal-size classes (City-Networks: 10).
        num_workers: worker processes (default, and at most: one per CPU this process may use).
        backend: ``"auto"``, ``"numba"`` or ``"scipy"``, see :func:`ball_eccentricity` (same results).
        use_cache: read/write the eccentricities in the on-disk cache, keyed by a hash of the graph and
            ``hops``.
        progress: show a tqdm bar.

    Returns:
        ``eccentricity`` float64 ``[N]`` (metres) and ``y`` int64 ``[N]`` in ``[0, num_classes)``.
    """
    if not isinstance(hops, int) or hops < 0:
        raise ValueError(f"hops must be a non-negative int, got {hops!r}")
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive int, got {num_classes!r}")
    _resolve_backend(backend)
    edge_index, edge_length = _check_graph(edge_index, edge_length, num_nodes)
    key = "labels/ecc-" + cache.content_hash(edge_index, edge_length, num_nodes=int(num_nodes), hops=hops)
    eccentricity = cache.load_array(key) if use_cache else None
    if eccentricity is None:
        adjacency = road_adjacency(edge_index, edge_length, int(num_nodes))
        eccentricity = ball_eccentricity(adjacency, hops, num_workers=num_workers, backend=backend,
                                         progress=progress)
        if use_cache:
            cache.save_array(key, eccentricity)
    eccentricity = torch.from_numpy(eccentricity)
    return eccentricity, partition_labels(eccentricity, num_classes)
