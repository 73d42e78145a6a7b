r"""S-SEG-WL: colour refinement with structural encodings, the test that bounds what GraphGPS can tell apart.

SEG-WL (Zhu et al., KDD 2023) refines node colours with a global term: every node sees every node of its
graph, together with a structural encoding of the pair. The k-MIP paper bounds the distinguishing power
of GraphGPS (local message passing + global attention, with k-MIP or full attention) by the S-SEG-WL
form used here, in which each round is

.. math::
    c^{t+1}(v) = \mathrm{hash}\big(c^t(v),\; \{\!\{c^t(u) : u \in N(v)\}\!\},\;
        \{\!\{(c^t(u), \varphi(v, u)) : u \in V(G)\}\!\}\big).

Encodings :math:`\varphi`: ``"none"`` (plain 1-WL plus the global multiset of colours), ``"spd"`` (the
shortest-path distance between v and u, ``-1`` when unreachable) and ``"rwse"`` (node-level random-walk
return probabilities :math:`(P^t)_{vv}`, ``t = 1..steps``, part of each node's colour as GraphGPS
concatenates them to the node features). Both graphs are refined together with one injective relabelling
per round (no hash collisions), until the partition of their nodes stops splitting; they are
distinguished when their colour histograms differ. Dense ``N × N`` encodings: meant for small graphs.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import shortest_path
from torch_geometric.data import Data

from kmipgt.analysis.hops import undirected_adjacency

__all__ = ["ENCODINGS", "WLResult", "random_walk_returns", "seg_wl", "shortest_paths"]

ENCODINGS = ("none", "spd", "rwse")
# Encodings are compared after rounding to this many decimals, so float noise never splits a colour.
_DECIMALS = 9


@dataclass
class WLResult:
    """Outcome of :func:`seg_wl`: ``colours`` is one ``[N_g]`` int array per graph (shared palette)."""

    distinguished: bool
    rounds: int
    num_colours: int
    colours: list[np.ndarray]


def shortest_paths(adjacency: sp.csr_matrix) -> np.ndarray:
    """``[N, N]`` int64 hop distances of an unweighted graph, ``-1`` between unreachable nodes."""
    hops = shortest_path(adjacency, unweighted=True, directed=False)
    return np.where(np.isinf(hops), -1, hops).astype(np.int64)


def random_walk_returns(adjacency: sp.csr_matrix, steps: int) -> np.ndarray:
    """``[N, steps]`` return probabilities :math:`(P^t)_{vv}` of the random walk ``P = D^{-1} A``."""
    if steps < 1:
        raise ValueError(f"rwse steps must be >= 1, got {steps}")
    dense = (adjacency > 0).toarray().astype(np.float64)
    degree = dense.sum(1, keepdims=True)
    walk = np.divide(dense, degree, out=np.zeros_like(dense), where=degree > 0)
    power, out = np.eye(len(dense)), []
    for _ in range(steps):
        power = power @ walk
        out.append(np.diag(power).copy())
    return np.stack(out, axis=1) if len(dense) else np.zeros((0, steps))


def _initial_signatures(graph: Data, adjacency: sp.csr_matrix, encoding: str, steps: int, features: bool):
    """One hashable starting signature per node: its features and, for ``rwse``, its encoding."""
    parts = []
    if features and graph.get("x") is not None:
        parts.append(graph.x.detach().double().cpu().numpy().reshape(graph.num_nodes, -1))
    if encoding == "rwse":
        parts.append(random_walk_returns(adjacency, steps))
    rows = np.concatenate(parts, axis=1).round(_DECIMALS) if parts else np.zeros((graph.num_nodes, 0))
    # -0.0 and 0.0 must be one colour: adding 0.0 turns the former into the latter.
    return [row.tobytes() for row in rows + 0.0]


def _relabel(signatures: list[list]) -> list[np.ndarray]:
    """Compact integer colours, injective over the signatures of every graph together."""
    palette: dict = {}
    return [
        np.array([palette.setdefault(s, len(palette)) for s in sigs], dtype=np.int64) for sigs in signatures
    ]


def _round_signatures(
    colours: np.ndarray, adjacency: sp.csr_matrix, pair: np.ndarray | None, width: int
) -> list[tuple]:
    """Each node's (colour, sorted neighbour colours, sorted (colour, pair code) over the whole graph)."""
    indptr, indices = adjacency.indptr, adjacency.indices
    if pair is None:
        # Without a pair encoding the global multiset is the same for every node of the graph.
        shared = np.sort(colours).tobytes()
        global_terms = [shared] * len(colours)
    else:
        codes = np.sort(colours[None, :] * width + pair, axis=1)
        global_terms = [row.tobytes() for row in codes]
    return [
        (int(colours[v]), np.sort(colours[indices[indptr[v] : indptr[v + 1]]]).tobytes(), global_terms[v])
        for v in range(len(colours))
    ]


def seg_wl(
    graphs: list[Data], encoding: str = "spd", *, rwse_steps: int = 16, features: bool = True
) -> WLResult:
    """Refine the colours of ``graphs`` together until stable; distinguished = histograms differ.

    Args:
        graphs: PyG graphs (``edge_index`` read as undirected; ``x``, when present and ``features``, gives
            the starting colours).
        encoding: one of :data:`ENCODINGS`.
        rwse_steps: walk lengths of the ``rwse`` encoding.
        features: start from the node features (else every node starts with one colour).

    Returns:
        :class:`WLResult`; ``distinguished`` compares the first two graphs' histograms, else False.
    """
    if encoding not in ENCODINGS:
        raise ValueError(f"encoding must be one of {ENCODINGS}, got {encoding!r}")
    adjacencies = [undirected_adjacency(g.edge_index, g.num_nodes) for g in graphs]
    pairs = [shortest_paths(a) + 1 if encoding == "spd" else None for a in adjacencies]
    width = max((g.num_nodes for g in graphs), default=0) + 1  # pair codes lie in 0..max N
    colours = _relabel(
        [_initial_signatures(g, a, encoding, rwse_steps, features) for g, a in zip(graphs, adjacencies)]
    )
    count, rounds = _num_colours(colours), 0
    while True:
        signatures = [_round_signatures(c, a, p, width) for c, a, p in zip(colours, adjacencies, pairs)]
        refined = _relabel(signatures)
        rounds += 1
        # Each signature holds the old colour, so a round only splits classes: equal counts = stable.
        if _num_colours(refined) == count:
            break
        colours, count = refined, _num_colours(refined)
    distinguished = len(graphs) >= 2 and Counter(colours[0].tolist()) != Counter(colours[1].tolist())
    return WLResult(distinguished, rounds, count, colours)


def _num_colours(colours: list[np.ndarray]) -> int:
    return len(np.unique(np.concatenate(colours))) if colours else 0
