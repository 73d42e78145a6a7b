"""Synthetic road networks with City-Networks statistics at any size (Voronoi blocks plus arterials).

Recipe (``reference/datasets.md`` §6, numpy/scipy only):

1. Seed points in a square of side ``60 m * sqrt(N)``: 60% Gaussian around 5 centres (sigma = 0.12 side),
   40% uniform; wrapped into the box with ``mod`` (clipping would create duplicate points, which Voronoi
   drops).
2. ``scipy.spatial.Voronoi`` of the seeds; its finite ridges inside the box are streets, its vertices (all of
   degree 3) junctions, like city blocks.
3. The shortest 10% of streets are contracted, creating 4-way junctions.
4. 12% of the streets outside a minimum spanning tree are dropped (connectivity is kept); largest component.
5. Degree-2 chains are contracted with their lengths summed, as OSMnx simplification does.
6. Arterials: ``arterial_fraction * n`` random junctions become hubs; the Delaunay triangulation over the hubs
   adds hub-to-hub roads of length 1.15 x the straight line (fast roads, bridges). This fraction sets the hop
   diameter (at ~105k nodes: 3e-4 -> ~180 hops, 1e-3 -> ~133, City-Networks Paris: 121 at 114k).
7. Cul-de-sacs: leaves of length U(20, 80) m on random hosts, as many as needed to reach ``num_nodes``.

Features follow City-Networks' 37 "augmented" columns (12 node columns + the mean of 25 edge columns over the
roads at each node); see ``SYNTHETIC_CITY_FEATURES``. Labels are :func:`eccentricity_labels`.
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components, minimum_spanning_tree
from scipy.spatial import Delaunay, Voronoi
from torch_geometric.data import Data
from torch_geometric.utils import scatter, to_undirected

from kmipgt.data.road_graph import road_network_data
from kmipgt.data.road_simplify import contract_degree2_chains, simple_edges

HIGHWAY_CLASSES = (
    "motorway", "trunk", "primary", "secondary", "tertiary", "residential", "service", "others",
)
LANE_CLASSES = ("1", "2", "3", "4", "5", "6", "7", "8", "others")
SYNTHETIC_CITY_FEATURES = (
    "x_m", "y_m", "street_count",
    *(f"landuse_{zone}" for zone in range(8)), "landuse_others",
    "length_m", "speed_kph", "oneway_false", "oneway_true", "oneway_others",
    *(f"lanes_{lanes}" for lanes in LANE_CLASSES),
    "reversed_false", "reversed_true", "reversed_others",
    *(f"highway_{name}" for name in HIGHWAY_CLASSES),
)
_CUL_DE_SAC_SHARE = 0.22 / 1.22  # leaves make up ~18% of nodes, as in real cities (deg-1 share .18-.23)
# Roads dropped at most in one last pass of the base network and about as many from the final graph when
# an exact edge count is asked for (drops there leave degree-2 nodes, so they are kept few).
_FINAL_DROP = 64
_BASE_NODES_PER_SEED = 1.5  # measured junctions left per Voronoi seed after steps 2-5; used to size step 1


def _seed_points(rng: np.random.Generator, num_seeds: int, side: float) -> np.ndarray:
    centres = rng.uniform(0.2 * side, 0.8 * side, size=(5, 2))
    num_clustered = int(0.6 * num_seeds)
    clustered = centres[rng.integers(0, 5, num_clustered)] + rng.normal(0, 0.12 * side, (num_clustered, 2))
    uniform = rng.uniform(0, side, size=(num_seeds - num_clustered, 2))
    return np.mod(np.concatenate([clustered, uniform]), side)


def _voronoi_streets(seeds: np.ndarray, side: float) -> tuple[np.ndarray, np.ndarray]:
    """Junction positions ``[V, 2]`` and streets ``[2, E]`` (finite Voronoi ridges inside the box)."""
    voronoi = Voronoi(seeds)
    ridges = np.asarray(voronoi.ridge_vertices, dtype=np.int64).T
    ridges = ridges[:, (ridges >= 0).all(axis=0)]
    inside = ((voronoi.vertices >= 0) & (voronoi.vertices <= side)).all(axis=1)
    ridges = ridges[:, inside[ridges].all(axis=0)]
    return _drop_unused_nodes(voronoi.vertices, ridges)


def _drop_unused_nodes(pos: np.ndarray, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keep the nodes that some edge uses, relabelled 0..V'-1."""
    used = np.zeros(pos.shape[0], dtype=bool)
    used[edges.ravel()] = True
    new_id = np.cumsum(used) - 1
    return pos[used], new_id[edges]


def _lengths(pos: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.linalg.norm(pos[edges[0]] - pos[edges[1]], axis=1)


def _contract_shortest(pos: np.ndarray, edges: np.ndarray, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """Merge the endpoints of the shortest ``fraction`` of edges (union-find via connected components)."""
    lengths = _lengths(pos, edges)
    short = np.argsort(lengths)[: int(fraction * edges.shape[1])]
    num_nodes = pos.shape[0]
    merge = coo_matrix((np.ones(short.size), tuple(edges[:, short])), shape=(num_nodes, num_nodes))
    _, group = connected_components(merge, directed=False)
    counts = np.bincount(group)
    merged_pos = np.stack([np.bincount(group, weights=pos[:, d]) / counts for d in range(2)], axis=1)
    merged_edges, _, _ = simple_edges(group[edges], np.zeros(edges.shape[1]))
    return merged_pos, merged_edges


def _non_tree_edges(pos: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Column indices of the edges outside a minimum spanning tree (forest) of ``edges`` (min, max pairs)."""
    num_nodes = pos.shape[0]
    lengths = _lengths(pos, edges) + 1e-9  # csgraph reads an explicit 0 as "no edge"
    tree = minimum_spanning_tree(coo_matrix((lengths, tuple(edges)), shape=(num_nodes, num_nodes))).tocoo()
    tree_keys = np.minimum(tree.row, tree.col).astype(np.int64) * num_nodes + np.maximum(tree.row, tree.col)
    return np.flatnonzero(~np.isin(edges[0] * num_nodes + edges[1], tree_keys))


def _drop_non_tree(rng: np.random.Generator, pos: np.ndarray, edges: np.ndarray, count: int) -> np.ndarray:
    """Keep mask ``[E]`` without ``count`` random edges from outside a minimum spanning tree, so
    connectivity is unchanged."""
    dropped = rng.choice(_non_tree_edges(pos, edges), size=count, replace=False)
    keep = np.ones(edges.shape[1], dtype=bool)
    keep[dropped] = False
    return keep


def _thin(rng: np.random.Generator, pos: np.ndarray, edges: np.ndarray, fraction: float) -> np.ndarray:
    """Drop ``fraction`` of the edges outside a minimum spanning tree, so connectivity is unchanged."""
    count = int(fraction * _non_tree_edges(pos, edges).size)
    return edges[:, _drop_non_tree(rng, pos, edges, count)]


def _base_network(rng: np.random.Generator, num_seeds: int, side: float, excess: int | None = None):
    """Junctions, streets and street lengths of steps 1-5; with ``excess``, further streets outside a
    spanning tree are dropped until ``E - V <= excess``. Chain contraction keeps ``E - V`` except where it
    merges parallel streets (measured: a few % of the drops), so the passes drop 3/4 of what is left
    until it is small, and undershoot ``excess`` by only a few roads."""
    seeds = _seed_points(rng, num_seeds, side)
    pos, edges = _voronoi_streets(seeds, side)
    pos, edges = _contract_shortest(pos, edges, 0.10)
    edges = _thin(rng, pos, edges, 0.12)
    pos, edges, lengths, _ = contract_degree2_chains(pos, edges, _lengths(pos, edges))
    while excess is not None and (surplus := edges.shape[1] - pos.shape[0] - excess) > 0:
        keep = _drop_non_tree(rng, pos, edges, surplus if surplus <= _FINAL_DROP else surplus * 3 // 4)
        pos, edges, lengths, _ = contract_degree2_chains(pos, edges[:, keep], lengths[keep])
    return pos, edges, lengths


def _arterials(rng: np.random.Generator, pos: np.ndarray, fraction: float) -> np.ndarray:
    """Hub-to-hub edges ``[2, A]``: Delaunay triangulation over ``round(fraction * n)`` random hubs."""
    num_hubs = round(fraction * pos.shape[0])
    if num_hubs < 2:
        return np.zeros((2, 0), dtype=np.int64)
    hubs = rng.choice(pos.shape[0], size=num_hubs, replace=False)
    if num_hubs == 2:
        return hubs[:, None]
    triangles = Delaunay(pos[hubs]).simplices
    pairs = np.concatenate([triangles[:, [0, 1]], triangles[:, [1, 2]], triangles[:, [0, 2]]])
    pairs = np.unique(np.sort(pairs, axis=1), axis=0)
    return hubs[pairs.T]


def _cul_de_sacs(rng: np.random.Generator, pos: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions ``[count, 2]`` of new leaves and their hosts ``[count]``, at U(20, 80) m from the host."""
    hosts = rng.integers(0, pos.shape[0], count)
    angle = rng.uniform(0, 2 * np.pi, count)
    radius = rng.uniform(20.0, 80.0, count)
    return pos[hosts] + radius[:, None] * np.stack([np.cos(angle), np.sin(angle)], axis=1), hosts


def _edge_features(rng: np.random.Generator, lengths: np.ndarray, highway: np.ndarray) -> np.ndarray:
    """The 25 City-Networks-like edge columns ``[E, 25]`` of undirected roads with highway classes ``[E]``."""
    num_edges = lengths.size
    is_arterial = highway <= 2
    speed = np.select([is_arterial, highway == 3, highway == 4], [rng.uniform(50, 70, num_edges), 50.0, 40.0],
                      30.0)
    oneway = np.where(is_arterial, 0, rng.choice(3, size=num_edges, p=[0.78, 0.20, 0.02]))
    lanes = np.where(is_arterial, rng.integers(1, 4, num_edges), rng.choice(2, num_edges, p=[0.8, 0.2]))
    lanes = np.where(rng.random(num_edges) < 0.1, 8, lanes)  # unknown lane count -> "others"
    # City-Networks averages both directions of a road, so a two-way road is half "reversed".
    reversed_columns = np.where((oneway == 1)[:, None], [1.0, 0.0, 0.0], [0.5, 0.5, 0.0])
    return np.concatenate([
        lengths[:, None], speed[:, None], np.eye(3)[oneway], np.eye(9)[lanes], reversed_columns,
        np.eye(8)[highway],
    ], axis=1)


def _local_highway_classes(rng: np.random.Generator, num_edges: int) -> np.ndarray:
    return rng.choice([3, 4, 5, 6, 7], size=num_edges, p=[0.08, 0.12, 0.60, 0.15, 0.05])


def synthetic_city(
    num_nodes: int,
    seed: int = 0,
    *,
    arterial_fraction: float = 1e-3,
    num_edges: int | None = None,
    labels: bool = True,
    hops: int = 16,
    num_classes: int = 10,
    num_workers: int | None = None,
    use_cache: bool = True,
    progress: bool = True,
) -> Data:
    """A synthetic city with exactly ``num_nodes`` junctions, as a road-network ``Data``.

    Args:
        num_nodes: number of nodes (>= 50).
        seed: seed of the generator (same seed, same graph).
        arterial_fraction: hubs per node for the arterial network; larger -> smaller hop diameter.
        num_edges: exact number of undirected roads (e.g. a real city's; default: what the recipe gives,
            about 1.43 per node). Fewer are reached by dropping more streets outside a spanning tree in
            step 4, before the chain contraction, so the degree mix stays road-like; a few more (the
            arterials, a small margin) are dropped the same way from the final graph. At least
            ``num_nodes`` and at most what the recipe gives.
        labels: compute City-Networks labels (``eccentricity``, ``y``) and the seed-0 split masks; the labels
            cost ~1-3 ms per node per core (cached on disk by graph content); pass False for scaling runs.
        hops, num_classes, num_workers, use_cache, progress: see :func:`eccentricity_labels`.

    Returns:
        ``Data`` with ``x`` float32 ``[N, 37]`` (``SYNTHETIC_CITY_FEATURES``; coordinates in metres),
        ``edge_index [2, E]`` (both directions), ``edge_length`` float64 ``[E]`` (metres), ``pos`` ``[N, 2]``
        (metres) and, with ``labels``, ``eccentricity``, ``y`` and the masks.
    """
    if not isinstance(num_nodes, int | np.integer) or num_nodes < 50:
        raise ValueError(f"num_nodes must be an int >= 50, got {num_nodes!r}")
    if not 0.0 <= arterial_fraction < 0.5:
        raise ValueError(f"arterial_fraction must lie in [0, 0.5), got {arterial_fraction}")
    if num_edges is not None and (not isinstance(num_edges, int | np.integer) or num_edges < num_nodes):
        raise ValueError(f"num_edges must be an int >= num_nodes ({num_nodes}), got {num_edges!r}")
    excess = None if num_edges is None else _base_excess(num_nodes, num_edges)
    rng = np.random.default_rng(seed)
    side = 60.0 * np.sqrt(num_nodes)
    target_base = num_nodes * (1 - _CUL_DE_SAC_SHARE)
    num_seeds = int(target_base / _BASE_NODES_PER_SEED)
    pos, edges, lengths = _base_network(rng, num_seeds, side, excess)
    # Boundary effects make the junctions per seed vary at small N: resize the seed set (a few tries at most)
    # so the base network fits under num_nodes and leaves stay near their real-city share.
    for _ in range(8):
        if 0.92 * target_base <= pos.shape[0] <= num_nodes:
            break
        num_seeds = max(8, int(num_seeds * target_base / pos.shape[0]))
        pos, edges, lengths = _base_network(rng, num_seeds, side, excess)
    if pos.shape[0] > num_nodes:
        raise RuntimeError(f"synthetic_city could not fit a base network under num_nodes={num_nodes}")
    highway = _local_highway_classes(rng, edges.shape[1])

    arterial = _arterials(rng, pos, arterial_fraction)
    arterial_lengths = 1.15 * _lengths(pos, arterial)
    leaf_pos, hosts = _cul_de_sacs(rng, pos, num_nodes - pos.shape[0])
    leaves = np.stack([hosts, np.arange(pos.shape[0], num_nodes)])
    leaf_lengths = _lengths(np.concatenate([pos, leaf_pos]), leaves)
    pos = np.concatenate([pos, leaf_pos])
    edges = np.concatenate([edges, arterial, leaves], axis=1)
    lengths = np.concatenate([lengths, arterial_lengths, leaf_lengths])
    highway = np.concatenate([highway, rng.integers(0, 3, arterial.shape[1]), np.full(leaves.shape[1], 6)])
    edges, order = _dedupe_keep_first(edges)
    lengths, highway = lengths[order], highway[order]
    if num_edges is not None:
        keep = _drop_non_tree(rng, pos, edges, _surplus(edges.shape[1], num_edges))
        edges, lengths, highway = edges[:, keep], lengths[keep], highway[keep]

    edge_features = torch.from_numpy(_edge_features(rng, lengths, highway))
    # The edges are simple, so no two directed edges are merged: each keeps its road's features.
    sym_index, directed_features = to_undirected(torch.from_numpy(edges), edge_features, num_nodes)
    # City-Networks augmentation: mean of the road features over the edges ending at the node
    incident_mean = scatter(directed_features, sym_index[1], dim=0, dim_size=num_nodes, reduce="mean")
    x = torch.cat([_node_features(rng, pos, sym_index, side), incident_mean], dim=1)
    return road_network_data(
        x.float(), sym_index, directed_features[:, 0], hops=hops, num_classes=num_classes, labels=labels,
        num_workers=num_workers, use_cache=use_cache, progress=progress, pos=torch.from_numpy(pos),
        name=f"synthetic_city_{num_nodes}" + ("" if num_edges is None else f"_{num_edges}e") + f"_seed{seed}",
    )


def _base_excess(num_nodes: int, num_edges: int) -> int:
    """``E - V`` to leave in the base network: cul-de-sacs add as many roads as nodes, so the final graph
    has ``E - N`` = the base's ``E - V`` plus the arterials; a margin covers parallel streets merged by
    the contraction's last pass, and the final graph drops what is left over."""
    return num_edges - num_nodes + _FINAL_DROP


def _surplus(have: int, want: int) -> int:
    if have < want:
        raise ValueError(f"num_edges={want} is more roads than this recipe gives at this size ({have})")
    return have - want


def _dedupe_keep_first(edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Undirected edges as (min, max) pairs, first occurrence of each pair kept; also their column indices."""
    pairs = np.sort(edges, axis=0)
    _, first = np.unique(pairs[0] * (pairs.max() + 1) + pairs[1], return_index=True)
    first = np.sort(first)
    return pairs[:, first], first


def _node_features(rng: np.random.Generator, pos: np.ndarray, edge_index: torch.Tensor, side: float):
    """x, y (metres), street count and a 9-way "landuse" one-hot (nearest of 9 random zone centres)."""
    street_count = np.bincount(edge_index[1].numpy(), minlength=pos.shape[0])
    zones = rng.uniform(0, side, size=(9, 2))
    zone = np.argmin(((pos[:, None, :] - zones[None]) ** 2).sum(-1), axis=1)
    return torch.from_numpy(np.concatenate([pos, street_count[:, None], np.eye(9)[zone]], axis=1))
