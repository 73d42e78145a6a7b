import numpy as np
import pytest
import torch
from scipy.spatial import distance_matrix
from sklearn.datasets import load_digits

from kmipgt.data import digits_knn, knn_graph_dataset


def test_knn_edges_match_brute_force():
    rng = np.random.default_rng(0)
    points = rng.normal(size=(80, 3))
    data = knn_graph_dataset(points, None, rng.integers(0, 4, 80), k=5)
    dist = distance_matrix(points, points)
    np.fill_diagonal(dist, np.inf)
    nearest = np.argsort(dist, axis=1)[:, :5]
    expected = {(int(j), i) for i in range(80) for j in nearest[i]}
    expected |= {(i, j) for j, i in expected}
    assert set(map(tuple, data.edge_index.t().tolist())) == expected
    assert data.edge_index.size(1) == len(expected)
    assert torch.allclose(data.x, torch.from_numpy(points).float()) and data.y.shape == (80,)
    assert [int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask)] == [8, 8, 64]


def test_digits_example_is_real_and_offline():
    data = digits_knn(k=10)
    assert data.num_nodes == 1797 and data.x.shape == (1797, 64)
    assert torch.equal(data.y, torch.from_numpy(load_digits().target))
    degree = torch.bincount(data.edge_index[1], minlength=1797)
    assert int(degree.min()) >= 10
    same_label = (data.y[data.edge_index[0]] == data.y[data.edge_index[1]]).float().mean()
    assert same_label > 0.9  # pixel-space neighbours mostly share the digit


def test_bad_arguments():
    points = np.zeros((10, 2))
    with pytest.raises(ValueError, match="k must"):
        knn_graph_dataset(points, None, None, k=10)
    with pytest.raises(ValueError, match="points"):
        knn_graph_dataset(np.zeros(10), None, None, k=2)
    with pytest.raises(ValueError, match="features"):
        knn_graph_dataset(points, np.zeros((9, 2)), None, k=2)
    with pytest.raises(ValueError, match="labels"):
        knn_graph_dataset(points, None, np.zeros(9), k=2)
