"""Road-graph clean-up shared by the synthetic and OSM networks: simple edges, largest component, and
OSMnx-style simplification (contracting chains of degree-2 nodes into single roads).

Edges are ``[2, E]`` integer arrays with one column per undirected road, ``lengths`` ``[E]`` metres.
Functions that drop or merge roads also return, per output road, the index of an input road it came from
(``source``), so callers can carry road attributes along.
"""

from __future__ import annotations

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components


def simple_edges(edges: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(min, max) pairs without self-loops, parallel roads keep the shortest: edges, lengths, source."""
    pairs = np.sort(edges, axis=0)
    candidates = np.flatnonzero(pairs[0] != pairs[1])
    order = candidates[np.lexsort((lengths[candidates], pairs[1, candidates], pairs[0, candidates]))]
    first = np.ones(order.size, dtype=bool)
    first[1:] = (pairs[:, order[1:]] != pairs[:, order[:-1]]).any(axis=0)
    kept = order[first]
    return pairs[:, kept], lengths[kept], kept


def largest_component(pos: np.ndarray, edges: np.ndarray, *edge_arrays: np.ndarray):
    """Nodes and roads of the largest connected component, nodes relabelled in their original order.

    Returns ``pos``, ``edges`` and each of ``edge_arrays`` restricted to the component's roads.
    """
    num_nodes = pos.shape[0]
    graph = coo_matrix((np.ones(edges.shape[1]), tuple(edges)), shape=(num_nodes, num_nodes))
    _, component = connected_components(graph, directed=False)
    in_largest = component == np.argmax(np.bincount(component))
    keep_edge = in_largest[edges[0]]
    new_id = np.cumsum(in_largest) - 1
    return (pos[in_largest], new_id[edges[:, keep_edge]], *(array[keep_edge] for array in edge_arrays))


def _contract_chains_once(num_nodes: int, edges: np.ndarray, lengths: np.ndarray):
    """Each maximal path through degree-2 nodes becomes one road with the summed length.

    Returns new edges, lengths, the source road of each (for a chain: one of its two end roads) and the
    mask of surviving nodes. Chains whose ends meet (loops) vanish and parallel roads merge, which can leave
    new degree-2 nodes, so :func:`contract_degree2_chains` repeats this.
    """
    degree = np.bincount(edges.ravel(), minlength=num_nodes)
    through = degree == 2
    inner = through[edges]
    kept = np.flatnonzero(~inner.any(axis=0))
    both_inner = inner.all(axis=0)
    chain_graph = coo_matrix((np.ones(int(both_inner.sum())), tuple(edges[:, both_inner])),
                             shape=(num_nodes, num_nodes))
    _, chain = connected_components(chain_graph, directed=False)
    touching = np.flatnonzero(inner.any(axis=0))
    edge_chain = np.where(inner[0, touching], chain[edges[0, touching]], chain[edges[1, touching]])
    chain_length = np.bincount(edge_chain, weights=lengths[touching], minlength=num_nodes)
    at_boundary = ~both_inner[touching]
    boundary = touching[at_boundary]
    outer_end = np.where(inner[0, boundary], edges[1, boundary], edges[0, boundary])
    boundary_chain = edge_chain[at_boundary]
    order = np.argsort(boundary_chain, kind="stable")
    # Every chain has exactly two boundary roads: its two end nodes have degree 2 and lie in the chain.
    ends = outer_end[order].reshape(-1, 2).T
    end_chain = boundary_chain[order][::2]
    candidates = np.concatenate([edges[:, kept], ends], axis=1)
    candidate_lengths = np.concatenate([lengths[kept], chain_length[end_chain]])
    candidate_source = np.concatenate([kept, boundary[order][::2]])
    new_edges, new_lengths, picked = simple_edges(candidates, candidate_lengths)
    return new_edges, new_lengths, candidate_source[picked], ~through


def contract_degree2_chains(pos: np.ndarray, edges: np.ndarray, lengths: np.ndarray):
    """Contract degree-2 chains until none is left, keeping the largest component.

    ``edges`` must be simple (see :func:`simple_edges`). Returns ``pos``, ``edges``, ``lengths`` and
    ``source`` (index into the input roads of a road each output road came from).
    """
    source = np.arange(edges.shape[1])
    pos, edges, lengths, source = largest_component(pos, edges, lengths, source)
    while (np.bincount(edges.ravel(), minlength=pos.shape[0]) == 2).any():
        edges, lengths, picked, survivors = _contract_chains_once(pos.shape[0], edges, lengths)
        source = source[picked]
        new_id = np.cumsum(survivors) - 1
        pos, edges = pos[survivors], new_id[edges]
        pos, edges, lengths, source = largest_component(pos, edges, lengths, source)
    return pos, edges, lengths, source
