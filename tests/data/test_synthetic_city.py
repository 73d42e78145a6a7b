import networkx as nx
import numpy as np
import pytest
import torch

from kmipgt.data.synthetic_city import SYNTHETIC_CITY_FEATURES, synthetic_city


@pytest.fixture(scope="module")
def city():
    return synthetic_city(3000, seed=1, labels=False)


def _graph(data) -> nx.Graph:
    graph = nx.Graph()
    graph.add_nodes_from(range(data.num_nodes))
    graph.add_edges_from(data.edge_index.t().tolist())
    return graph


def test_exact_size_connected_simple_symmetric(city):
    assert city.num_nodes == 3000 and city.x.shape == (3000, 37) == (3000, len(SYNTHETIC_CITY_FEATURES))
    graph = _graph(city)
    assert nx.is_connected(graph)
    assert city.edge_index.size(1) == 2 * graph.number_of_edges()  # both directions, no duplicates
    assert nx.number_of_selfloops(graph) == 0


def test_degree_mix_is_road_like(city):
    degree = np.array([d for _, d in sorted(_graph(city).degree())])
    share = [np.mean(degree == k) for k in (1, 2, 3, 4)]
    assert 0.12 <= share[0] <= 0.30  # cul-de-sacs (real cities .18-.23)
    assert share[1] <= 0.03  # degree-2 chains are contracted, as OSMnx does
    assert 0.40 <= share[2] <= 0.70 and 0.10 <= share[3] <= 0.30
    assert 2.6 <= degree.mean() <= 3.1


def test_lengths_and_features_are_consistent(city):
    src, dst = city.edge_index.numpy()
    straight = np.linalg.norm(city.pos[src].numpy() - city.pos[dst].numpy(), axis=1)
    length = city.edge_length.numpy()
    assert (length >= straight - 1e-6).all() and (length > 0).all()
    names = list(SYNTHETIC_CITY_FEATURES)
    x = city.x.numpy()
    np.testing.assert_allclose(x[:, names.index("street_count")], np.bincount(dst, minlength=3000))
    mean_length = np.bincount(dst, weights=length, minlength=3000) / np.bincount(dst, minlength=3000)
    np.testing.assert_allclose(x[:, names.index("length_m")], mean_length, rtol=1e-5)
    landuse = [i for i, name in enumerate(names) if name.startswith("landuse_")]
    np.testing.assert_allclose(x[:, landuse].sum(1), 1.0)
    for prefix in ("oneway_", "lanes_", "reversed_", "highway_"):
        columns = [i for i, name in enumerate(names) if name.startswith(prefix)]
        np.testing.assert_allclose(x[:, columns].sum(1), 1.0, rtol=1e-5)


def test_deterministic_per_seed(city):
    again = synthetic_city(3000, seed=1, labels=False)
    assert torch.equal(city.edge_index, again.edge_index) and torch.equal(city.x, again.x)
    other = synthetic_city(3000, seed=2, labels=False)
    assert not torch.equal(city.pos, other.pos)


@pytest.mark.parametrize(("num_nodes", "num_edges"), [(3000, 3990), (3000, 3100), (5000, 6650)])
def test_exact_edge_count_keeps_a_connected_road_like_graph(num_nodes, num_edges):
    data = synthetic_city(num_nodes, seed=1, num_edges=num_edges, labels=False)
    graph = _graph(data)
    assert data.num_nodes == num_nodes and graph.number_of_edges() == num_edges
    assert data.edge_index.size(1) == 2 * num_edges and nx.is_connected(graph)
    assert nx.number_of_selfloops(graph) == 0
    degree = np.array([d for _, d in graph.degree()])
    if num_edges / num_nodes > 1.3:  # London's ratio (1.33): chains are contracted before the last drops
        assert np.mean(degree == 2) <= 0.05


def test_default_edge_count_is_unchanged_by_the_option():
    # The recipe's own count, as before num_edges existed (hashes of the labels cache depend on it).
    assert synthetic_city(3000, seed=1, labels=False).edge_index.size(1) == 8696


def test_more_edges_than_the_recipe_gives_is_an_error():
    with pytest.raises(ValueError, match="more roads than this recipe"):
        synthetic_city(3000, seed=1, num_edges=6000, labels=False)


def test_arterials_shrink_the_hop_diameter():
    def hop_eccentricity_from_centre(data):
        graph = _graph(data)
        centre = int(torch.argmin((data.pos - data.pos.mean(0)).norm(dim=1)))
        return max(nx.single_source_shortest_path_length(graph, centre).values())

    local_only = synthetic_city(6000, seed=0, arterial_fraction=0.0, labels=False)
    with_arterials = synthetic_city(6000, seed=0, arterial_fraction=1e-2, labels=False)
    assert hop_eccentricity_from_centre(with_arterials) < hop_eccentricity_from_centre(local_only)


def test_labels_match_networkx_and_split():
    data = synthetic_city(800, seed=3, hops=16, progress=False)
    assert torch.bincount(data.y).tolist() == [81] * 9 + [71]
    assert [int(m.sum()) for m in (data.train_mask, data.val_mask, data.test_mask)] == [80, 80, 640]
    graph = nx.Graph()
    for (i, j), length in zip(data.edge_index.t().tolist(), data.edge_length.tolist(), strict=True):
        graph.add_edge(i, j, length=length)
    for node in range(0, 800, 97):
        ball = nx.single_source_shortest_path_length(graph, node, cutoff=16)
        expected = nx.eccentricity(graph.subgraph(ball), v=node, weight="length")
        assert abs(float(data.eccentricity[node]) - expected) < 1e-6


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_nodes": 10}, "num_nodes"), ({"num_nodes": 500.0}, "num_nodes"),
    ({"num_nodes": 500, "arterial_fraction": -0.1}, "arterial_fraction"),
    ({"num_nodes": 500, "num_edges": 499}, "num_edges"),
    ({"num_nodes": 500, "num_edges": 600.0}, "num_edges"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_city(**kwargs, labels=False)
