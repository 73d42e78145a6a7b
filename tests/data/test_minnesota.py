import networkx as nx
import numpy as np
import pytest
import torch

from kmipgt.data import MINNESOTA_FEATURES, minnesota


@pytest.fixture(scope="module")
def data():
    return minnesota(use_cache=False)


def test_minnesota_counts_and_structure(data):
    assert data.num_nodes == 2642
    assert data.edge_index.shape == (2, 2 * 3304)
    assert data.x.shape == (2642, len(MINNESOTA_FEATURES))
    assert data.edge_length.shape == (2 * 3304,) and data.edge_length.dtype == torch.float64
    edges = set(map(tuple, data.edge_index.t().tolist()))
    assert all((j, i) in edges for i, j in edges)
    graph = nx.Graph(list(edges))
    assert nx.is_connected(graph) and graph.number_of_nodes() == 2642
    degree = torch.tensor([graph.degree(i) for i in range(2642)], dtype=torch.float32)
    torch.testing.assert_close(data.x[:, 2], degree)
    assert torch.bincount(data.y).tolist() == [265] * 9 + [257]
    sizes = [int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask)]
    assert sizes == [264, 264, 2114]


def test_minnesota_lengths_are_metres(data):
    lonlat = data.pos.numpy()
    src, dst = data.edge_index.numpy()
    # Independent check: equirectangular approximation, accurate to well under 1% over a few km.
    mean_lat = np.radians((lonlat[src, 1] + lonlat[dst, 1]) / 2)
    dx = np.radians(lonlat[dst, 0] - lonlat[src, 0]) * np.cos(mean_lat)
    dy = np.radians(lonlat[dst, 1] - lonlat[src, 1])
    approx = 6_371_000.0 * np.hypot(dx, dy)
    np.testing.assert_allclose(data.edge_length.numpy(), approx, rtol=5e-3)
    mean_incident = np.bincount(dst, weights=data.edge_length.numpy()) / np.bincount(dst)
    np.testing.assert_allclose(data.x[:, 3].numpy(), mean_incident, rtol=1e-6)


def test_minnesota_labels_match_networkx_on_sample(data):
    graph = nx.Graph()
    for (i, j), length in zip(data.edge_index.t().tolist(), data.edge_length.tolist(), strict=True):
        graph.add_edge(i, j, length=length)
    for node in np.random.default_rng(0).choice(2642, size=8, replace=False).tolist():
        ball = nx.single_source_shortest_path_length(graph, node, cutoff=16)
        expected = nx.eccentricity(graph.subgraph(ball), v=node, weight="length")
        assert abs(float(data.eccentricity[node]) - expected) < 1e-6
