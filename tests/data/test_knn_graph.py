"""knn_graph over batches of point clouds against a brute-force distance computation."""

import numpy as np
import pytest
import torch
from scipy.spatial import distance_matrix

from kmipgt.data import knn_graph


def _brute_force(points: np.ndarray, k: int) -> set[tuple[int, int]]:
    dist = distance_matrix(points, points)
    np.fill_diagonal(dist, np.inf)
    nearest = np.argsort(dist, axis=1, kind="stable")[:, :k]
    return {(int(j), i) for i in range(len(points)) for j in nearest[i]}


def _batched(sizes, seed=0):
    rng = np.random.default_rng(seed)
    clouds = [rng.normal(size=(n, 3)) for n in sizes]
    batch = np.repeat(np.arange(len(sizes)), sizes)
    return clouds, np.concatenate(clouds), torch.from_numpy(batch)


def test_directed_edges_match_brute_force_per_cloud():
    clouds, pos, batch = _batched([20, 9, 31])
    edge_index = knn_graph(torch.from_numpy(pos).float(), 4, batch)
    expected, offset = set(), 0
    for cloud in clouds:
        expected |= {(j + offset, i + offset) for j, i in _brute_force(cloud, 4)}
        offset += len(cloud)
    assert edge_index.dtype == torch.long and edge_index.shape == (2, 60 * 4)
    assert set(map(tuple, edge_index.t().tolist())) == expected
    # grouped by target, k in-edges each, nearest first
    assert torch.equal(edge_index[1], torch.arange(60).repeat_interleave(4))
    d = np.linalg.norm(pos[edge_index[0]] - pos[edge_index[1]], axis=1).reshape(60, 4)
    assert np.all(np.diff(d, axis=1) >= 0)


def test_symmetric_is_the_union_of_both_directions():
    _, pos, batch = _batched([15, 12], seed=1)
    directed = set(map(tuple, knn_graph(pos, 3, batch).t().tolist()))
    both = knn_graph(pos, 3, batch, symmetric=True)
    assert set(map(tuple, both.t().tolist())) == directed | {(i, j) for j, i in directed}
    assert both.size(1) == len(directed | {(i, j) for j, i in directed})
    assert int(torch.bincount(both[1]).min()) >= 3


def test_ties_keep_the_k_smallest_distances():
    # a 4 x 4 grid: many neighbours at equal distance
    grid = np.stack(np.meshgrid(np.arange(4.0), np.arange(4.0)), -1).reshape(-1, 2)
    edge_index = knn_graph(grid, 3).numpy()
    dist = distance_matrix(grid, grid)
    np.fill_diagonal(dist, np.inf)
    for i in range(16):
        sources = edge_index[0][edge_index[1] == i]
        assert i not in sources and len(set(sources)) == 3
        assert np.allclose(np.sort(dist[i, sources]), np.sort(dist[i])[:3])


def test_duplicate_points_are_neighbours_but_never_self():
    pos = np.zeros((4, 3))
    edge_index = knn_graph(pos, 3)
    assert not bool((edge_index[0] == edge_index[1]).any())
    assert edge_index.size(1) == 12


def test_bad_arguments():
    pos = torch.randn(10, 3)
    with pytest.raises(ValueError, match="k must be smaller"):
        knn_graph(pos, 5, torch.tensor([0] * 5 + [1] * 5))
    with pytest.raises(ValueError, match="k must be a positive int"):
        knn_graph(pos, 0)
    with pytest.raises(ValueError, match="batch must be sorted"):
        knn_graph(pos, 2, torch.tensor([0, 1] * 5))
    with pytest.raises(ValueError, match="batch must have shape"):
        knn_graph(pos, 2, torch.zeros(9, dtype=torch.long))
    with pytest.raises(ValueError, match="pos must have shape"):
        knn_graph(torch.randn(10), 2)
