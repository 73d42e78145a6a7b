"""The neighbourhood probe: walk means and spatial means against dense references, a planted signal."""

import networkx as nx
import numpy as np
import pytest
import torch

from kmipgt.analysis.probe import (
    hop_means,
    label_agreement_by_hops,
    nearest_labels_accuracy,
    neighbourhood_probe,
    spatial_means,
)


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


def test_label_agreement_by_hops_equals_networkx_pair_counts():
    gen = torch.Generator().manual_seed(4)
    n = 60
    edge_index = torch.randint(0, n, (2, 70), generator=gen)  # sparse: long paths, some components apart
    y = torch.randint(0, 3, (n,), generator=gen)
    graph = nx.Graph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from(edge_index.t().tolist())
    lengths = dict(nx.all_pairs_shortest_path_length(graph))
    longest = max(d for row in lengths.values() for d in row.values())
    # The last ring ends at the longest distance, so the BFS cap itself is checked.
    rings = ((1, 1), (2, 3), (4, longest))
    rows = label_agreement_by_hops(y, edge_index, rings, num_sources=n)
    assert set(rows) == {"1", "2-3", f"4-{longest}"}
    for lo, hi in rings:
        pairs = np.array([(u, v) for u in range(n) for v, d in lengths[u].items() if lo <= d <= hi])
        source, target = y[pairs[:, 0]], y[pairs[:, 1]]
        shares = [(source == c).double().mean() * (target == c).double().mean() for c in range(3)]
        expected_mix = float(sum(shares))
        same, mix = rows[f"{lo}" if lo == hi else f"{lo}-{hi}"]
        assert same == pytest.approx(float((source == target).double().mean()))
        assert mix == pytest.approx(expected_mix)
    assert label_agreement_by_hops(y, edge_index, ((longest + 1, longest + 5),)) == {}  # no pair that far
    assert label_agreement_by_hops(y, edge_index, rings, num_sources=10 * n) == rows
    for bad in ({"rings": ()}, {"rings": ((0, 2),)}, {"rings": ((1, 1),), "num_sources": 0}):
        with pytest.raises(ValueError):
            label_agreement_by_hops(y, edge_index, **{"num_sources": n, **bad})
    with pytest.raises(ValueError, match="integer labels"):
        label_agreement_by_hops(y.double(), edge_index, rings)


def test_label_agreement_from_sampled_sources_is_close_to_the_analytic_rate():
    # A 30 x 30 grid in stripes 6 rows wide. Of its 1,740 edges the 870 within rows join equal labels, and
    # of the 870 between rows the 120 crossing the 4 stripe boundaries join different ones.
    grid = nx.convert_node_labels_to_integers(nx.grid_2d_graph(30, 30), ordering="sorted")
    edge_index = torch.tensor(list(grid.edges)).t()
    y = torch.arange(900) // 30 // 6  # node i is row i // 30 of the sorted (row, column) grid
    sampled = label_agreement_by_hops(y, edge_index, ((1, 1), (5, 8), (20, 40)), num_sources=300, seed=2)
    assert sampled["1"][0] == pytest.approx(1620 / 1740, abs=0.02)
    assert sampled["1"][0] > sampled["5-8"][0] > sampled["20-40"][0]
    # Equal stripes, and every ring reaches all of them about evenly: the label mix gives about 1/5.
    assert all(mix == pytest.approx(0.2, abs=0.03) for _, mix in sampled.values())


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
                 "--label-k", "1,5", "--rings", "1,2-4", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert set(rows) == {"config", "overrides", "hops<=0", "hops<=2", "spatial 16", "hops<=2 + spatial 16",
                         "nearest labels 1", "nearest labels 5", "same_label"}
    assert set(rows["same_label"]) == {"1", "2-4"}
    printed = capsys.readouterr().out
    assert all(f"| {name} | {rows[name]:.3f} |" in printed for name in ("hops<=0", "spatial 16"))
    ring = rows["same_label"]["2-4"]
    assert f"| 2-4 | {ring['same']:.3f} | {ring['expected']:.3f} |" in printed
    for bad in ("4-2", "3-", "0-3", "x"):
        with pytest.raises(SystemExit):
            main(["analysis", "probe", "--config", str(config), "--rings", bad])
    assert main(["analysis", "probe", "--config", str(config), "--set", "task.level=graph"]) == 2
