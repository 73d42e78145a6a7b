"""The neighbourhood probe: walk means and spatial means against dense references, a planted signal."""

import networkx as nx
import numpy as np
import torch

from kmipgt.analysis.probe import hop_means, nearest_labels_accuracy, neighbourhood_probe, spatial_means


def test_hop_means_equal_dense_random_walk_powers():
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, 15, (2, 30), generator=gen)
    x = torch.randn(15, 3, generator=gen, dtype=torch.float64)
    graph = nx.Graph()
    graph.add_nodes_from(range(15))
    graph.add_edges_from(edge_index.t().tolist())
    adjacency = nx.to_numpy_array(graph, nodelist=range(15))
    adjacency = (adjacency > 0) + np.eye(15)
    walk = adjacency / adjacency.sum(1, keepdims=True)
    out = hop_means(x, edge_index, 3)
    for h in range(4):
        np.testing.assert_allclose(out[h].numpy(), np.linalg.matrix_power(walk, h) @ x.numpy(), atol=1e-12)


def test_spatial_means_equal_brute_force_nearest():
    gen = torch.Generator().manual_seed(1)
    coords, x = torch.rand(40, 2, generator=gen), torch.randn(40, 4, generator=gen)
    distances = torch.cdist(coords, coords)
    expected = x[distances.argsort(1)[:, :5]].mean(1)
    torch.testing.assert_close(spatial_means(x, coords, 5), expected)


def test_nearest_labels_accuracy_equals_a_brute_force_weighted_vote():
    gen = torch.Generator().manual_seed(3)
    n, classes, k = 300, 4, 5
    coords = torch.rand(n, 2, generator=gen, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=gen)
    train = torch.rand(n, generator=gen) < 0.3
    distances = torch.cdist(coords[~train], coords[train])
    nearest = distances.topk(k, dim=1, largest=False)
    votes = torch.zeros(int((~train).sum()), classes, dtype=torch.float64)
    votes.scatter_add_(1, y[train][nearest.indices], 1.0 / nearest.values)
    expected = (votes.argmax(1) == y[~train]).double().mean().item()
    assert nearest_labels_accuracy(coords, y, train, ~train, k) == expected
    # More voters than training nodes: every training node votes.
    everyone = int(train.sum())
    assert nearest_labels_accuracy(coords, y, train, ~train, 10_000) == nearest_labels_accuracy(
        coords, y, train, ~train, everyone
    )


def test_probe_finds_a_label_planted_in_spatial_neighbourhoods():
    gen = torch.Generator().manual_seed(2)
    n = 2000
    coords, x = torch.rand(n, 2, generator=gen), torch.randn(n, 2, generator=gen)
    # The label is the sign of a regional average: invisible in each node's own noisy features and in
    # a random graph's hop neighbourhoods, but read off directly by a spatial mean.
    y = (spatial_means(x, coords, 200)[:, 0] > 0).long()
    edge_index = torch.randint(0, n, (2, 3 * n), generator=gen)
    train = torch.rand(n, generator=gen) < 0.5
    rows = neighbourhood_probe(
        x, y, edge_index, train, ~train, coords, hops=(0, 2), spatial_k=(200,), label_k=(5,)
    )
    assert rows["hops<=0"] < 0.7
    assert rows["hops<=2"] < 0.7
    assert rows["spatial 200"] > 0.9
    assert rows["hops<=2 + spatial 200"] > 0.9
    # A regional average is smooth in space, so the labelled nodes around a node give its label away.
    assert rows["nearest labels 5"] > 0.9
    no_coords = neighbourhood_probe(x, y, edge_index, train, ~train, hops=(0,), label_k=(5,))
    assert set(no_coords) == {"hops<=0"}


def test_probe_command_prints_and_writes_every_row(tmp_path, capsys):
    import json

    import yaml

    from kmipgt.cli import main

    config = tmp_path / "city.yaml"
    config.write_text(yaml.safe_dump({
        "data": {"name": "synthetic_city", "options": {"num_nodes": 600, "seed": 0}},
        "model": {"coord_columns": [0, 1]},
    }))
    out = tmp_path / "probe.json"
    assert main(["analysis", "probe", "--config", str(config), "--hops", "0,2", "--spatial", "16",
                 "--label-k", "1,5", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert set(rows) == {"config", "overrides", "hops<=0", "hops<=2", "spatial 16", "hops<=2 + spatial 16",
                         "nearest labels 1", "nearest labels 5"}
    printed = capsys.readouterr().out
    assert all(f"| {name} | {rows[name]:.3f} |" in printed for name in ("hops<=0", "spatial 16"))
    assert main(["analysis", "probe", "--config", str(config), "--set", "task.level=graph"]) == 2
