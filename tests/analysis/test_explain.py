"""`kmipgt analysis explain`: attended keys, hop distances and statistics against independent references."""

import importlib
import json
import math

import networkx as nx
import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

import kmipgt.analysis.explain_stats as explain_stats
import kmipgt.analysis.hops as hops_module
from kmipgt.analysis import (
    attended_keys,
    attention_modules,
    explain,
    explain_graphs,
    hop_distances,
    share_beyond,
    undirected_adjacency,
)
from kmipgt.data import add_virtual_node
from kmipgt.nn import GraphTransformer, KMIPAttention

# The module, not the function of the same name that kmipgt.analysis exports.
explain_module = importlib.import_module("kmipgt.analysis.explain")
HOP_BINS = explain_module.HOP_CAP + 2


def _graph(num_nodes=40, seed=0, classes=3) -> Data:
    """A connected ring with random chords (edges in one direction only), labels and a train mask."""
    gen = torch.Generator().manual_seed(seed)
    ring = torch.stack([torch.arange(num_nodes), (torch.arange(num_nodes) + 1) % num_nodes])
    chords = torch.randint(0, num_nodes, (2, num_nodes // 4), generator=gen)
    return Data(
        x=torch.randn(num_nodes, 3, generator=gen),
        edge_index=torch.cat([ring, chords], dim=1),
        edge_attr=torch.randn(ring.size(1) + chords.size(1), 1, generator=gen),
        y=torch.randint(0, classes, (num_nodes,), generator=gen),
        train_mask=torch.rand(num_nodes, generator=gen) < 0.3,
    )


def _model(attention="kmip", heads=2, k=5, num_layers=2, seed=0, attention_layers=None) -> GraphTransformer:
    torch.manual_seed(seed)
    return GraphTransformer(
        3, 8, 3, num_layers=num_layers, edge_channels=1, attention=attention,
        attn_kwargs={"heads": heads, "layers": attention_layers, **({"k": k} if attention == "kmip" else {})},
    )


def _attention_io(model: GraphTransformer, graph: Data) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Input and output of each layer's attention module in one eval forward (captured by hooks)."""
    captured = []
    handles = [
        layer.attention.register_forward_hook(lambda m, args, out: captured.append((args[0], out)))
        for layer in model.layers if layer.attention is not None
    ]
    model.eval()
    with torch.no_grad():
        model.embed(graph.x, graph.edge_index, edge_attr=graph.edge_attr)
    for handle in handles:
        handle.remove()
    return captured


def _set_projections(module, w_query: torch.Tensor, w_key: torch.Tensor) -> None:
    with torch.no_grad():
        module.lin_query.weight.copy_(w_query)
        module.lin_key.weight.copy_(w_key)
        module.lin_query.bias.zero_()
        module.lin_key.bias.zero_()


@pytest.mark.parametrize("attention", ["kmip", "full"])
def test_attended_keys_are_the_dense_top_k_with_softmax_weights(attention):
    graph = _graph()
    model = _model(attention, heads=2, k=5, num_layers=1)
    # Hand-set projections: head 0 scores q = 2·h against k = h, head 1 uses a reversed basis.
    eye = torch.eye(8)
    w_query = torch.cat([2 * eye[:4], eye[4:].flip(0)])
    _set_projections(model.layers[0].attention, w_query, eye)
    queries = [0, 7, 21, 39]
    (selection,) = attended_keys(model, graph, queries, k=5)
    ((h, _),) = _attention_io(model, graph)

    hq, hk = h.double().numpy() @ w_query.double().numpy().T, h.double().numpy()
    for head in range(2):
        q, k = hq[:, 4 * head : 4 * head + 4], hk[:, 4 * head : 4 * head + 4]
        scores = q[queries] @ k.T  # independent dense QKᵀ of the chosen queries
        top = np.argsort(-scores, axis=1, kind="stable")[:, :5]
        np.testing.assert_array_equal(selection.index[:, head].numpy(), top)
        top_scores = np.take_along_axis(scores, top, 1)
        assert (np.diff(top_scores, axis=1) <= 0).all()  # descending
        np.testing.assert_allclose(selection.score[:, head].numpy(), top_scores, rtol=1e-4, atol=1e-4)
        logits = top_scores / 2.0  # 1/sqrt(head_dim = 4)
        expected = np.exp(logits - logits.max(1, keepdims=True))
        np.testing.assert_allclose(
            selection.weight[:, head].numpy(), expected / expected.sum(1, keepdims=True), rtol=1e-4, atol=1e-6
        )
        if attention == "full":
            full = np.exp(scores / 2.0 - scores.max(1, keepdims=True) / 2.0)
            full /= full.sum(1, keepdims=True)
            np.testing.assert_allclose(
                selection.mass[:, head].numpy(), np.take_along_axis(full, top, 1).sum(1), rtol=1e-4
            )


def _assert_reproduces_output(module, selection, h: torch.Tensor, out: torch.Tensor) -> None:
    """Independent dense gather -> softmax -> weighted sum over the hooked indices (2 heads of 4)."""
    q, k, v = (lin(h).view(h.size(0), 2, 4) for lin in (module.lin_query, module.lin_key, module.lin_value))
    index = selection.index
    heads = torch.arange(2)[None, :, None]
    logits = (q[:, :, None, :] * k[index, heads]).sum(-1) / 2.0
    weights = torch.softmax(logits, dim=-1)
    mixed = (weights[..., None] * v[index, heads]).sum(2)
    torch.testing.assert_close(module.lin_out(mixed.reshape(h.size(0), 8)), out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(selection.weight, weights, atol=1e-6, rtol=1e-5)


def test_hooked_indices_reproduce_the_attention_output():
    graph = _graph(seed=2)
    model = _model("kmip", heads=2, k=4, num_layers=2)
    selections = attended_keys(model, graph)  # every node a query
    for layer, (selection, (h, out)) in enumerate(zip(selections, _attention_io(model, graph))):
        _assert_reproduces_output(model.layers[layer].attention, selection, h, out)


def test_layers_without_attention_are_skipped_and_named():
    graph = _graph(seed=2)
    model = _model("kmip", heads=2, k=4, num_layers=3, attention_layers=[0, -1])
    assert list(attention_modules(model)) == [0, 2]
    selections = attended_keys(model, graph)
    captured = _attention_io(model, graph)
    assert len(selections) == len(captured) == 2
    for layer, selection, (h, out) in zip((0, 2), selections, captured):
        _assert_reproduces_output(model.layers[layer].attention, selection, h, out)
    result = explain(model, graph, torch.arange(40), [0, 5])
    assert sorted({entry["layer"] for entry in result["layers"]}) == [0, 2]
    one = explain(model, graph, torch.arange(40), [0], layer=2)
    assert [entry["layer"] for entry in one["layers"]] == [2, 2]  # one per head
    with pytest.raises(ValueError, match=r"layer 1 has no global attention; .* are 0, 2"):
        explain(model, graph, torch.arange(40), [0], layer=1)
    with pytest.raises(ValueError, match="'none' in every layer"):
        attended_keys(_model("none"), graph)


def test_module_hook_on_a_ragged_batch_pads_small_graphs():
    torch.manual_seed(0)
    module = KMIPAttention(8, heads=2, k=6).eval()
    x = torch.randn(12, 8)
    batch = torch.tensor([0] * 9 + [1] * 3)
    module.keep_attention = True
    module(x, batch=batch)
    selection = module.last_attention
    assert selection.index.shape == (12, 2, 6)
    small = selection.index[9:]
    assert ((small >= 9) | (small == -1)).all() and (small == -1).sum() == 3 * 2 * 3
    torch.testing.assert_close(selection.weight.sum(-1), torch.ones(12, 2))
    assert (selection.weight[selection.index < 0] == 0).all()


@pytest.mark.parametrize("compiled", [True, False])
def test_hop_distances_match_networkx_with_the_cap(compiled, monkeypatch):
    if not compiled:
        monkeypatch.setattr(hops_module, "numba", None)
    elif hops_module.numba is None:
        pytest.skip("numba is not installed")
    gen = torch.Generator().manual_seed(3)
    path = torch.stack([torch.arange(29), torch.arange(1, 30)])  # a 30-node path, one direction only
    extra = torch.tensor([[30, 31], [31, 32]])  # a separate component
    edge_index = torch.cat([path, extra, torch.randint(0, 30, (2, 3), generator=gen)], dim=1)
    adjacency = undirected_adjacency(edge_index, 34)  # node 33 is isolated
    reference = nx.Graph(edge_index.t().tolist())
    reference.add_nodes_from(range(34))
    sources = np.array([0, 5, 30, 33, 12])
    targets = np.array([[0, 29, 31, -1], [4, 33, 29, 6], [32, 0, 30, 31], [33, 0, -1, 1], [2, 20, 28, 13]])
    for cap in (64, 6):
        hops = hop_distances(adjacency, sources, targets, cap=cap)
        for q, source in enumerate(sources):
            lengths = nx.single_source_shortest_path_length(reference, int(source))
            for t, target in enumerate(targets[q]):
                expected = lengths.get(int(target), -1) if target >= 0 else -1
                assert hops[q, t] == (expected if expected <= cap else -1), (source, target, cap)


def test_statistics_equal_a_direct_computation_from_the_json_rows(monkeypatch):
    monkeypatch.setattr(explain_stats, "CHUNK", 7)  # stream the split in several chunks
    graph = _graph(num_nodes=45, seed=4)
    model = _model("kmip", heads=2, k=6, num_layers=2)
    everything = torch.arange(45)
    result = explain(model, graph, everything, everything, labels=graph.y, train_mask=graph.train_mask)
    result = json.loads(json.dumps(result))  # what explain.json holds
    reference = nx.Graph(graph.edge_index.t().tolist())
    lengths = dict(nx.all_pairs_shortest_path_length(reference))
    y, train = graph.y.tolist(), graph.train_mask.tolist()
    base = np.mean([np.mean([y[j] == y[i] for j in range(45)]) for i in range(45)])
    assert [(e["layer"], e["head"]) for e in result["layers"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for entry in result["layers"]:
        keys = [(row, key) for row in entry["queries"] for key in row["keys"]]
        for row, key in keys:
            assert key["hops"] == lengths[row["node"]].get(key["node"])
            assert key["train"] == train[key["node"]] and key["same_label"] == (
                y[key["node"]] == row["label"]
            )
        for row in entry["queries"]:
            assert math.isclose(sum(key["weight"] for key in row["keys"]), 1.0, rel_tol=1e-5)
        total = sum(key["weight"] for _, key in keys)
        histogram = {
            str(h): sum(key["weight"] for _, key in keys if key["hops"] == h) / total for h in range(65)
        }
        histogram[">64"] = sum(key["weight"] for _, key in keys if key["hops"] is None) / total
        stats = entry["stats"]
        assert stats["hops_histogram"] == pytest.approx(histogram, abs=1e-9)
        assert stats["mean_hops"] == pytest.approx(
            sum(key["weight"] * key["hops"] for _, key in keys) / total
        )
        assert stats["weight_on_train"] == pytest.approx(
            sum(key["weight"] for _, key in keys if key["train"]) / total
        )
        assert stats["same_label_rate"] == pytest.approx(
            sum(key["weight"] for _, key in keys if key["same_label"]) / total
        )
        assert stats["base_same_label_rate"] == pytest.approx(base)
        entropy = [
            -sum(k["weight"] * math.log(k["weight"]) for k in row["keys"] if k["weight"] > 0)
            for row in entry["queries"]
        ]
        assert stats["entropy"] == pytest.approx(np.mean(entropy), rel=1e-5)
        assert stats["distinct_keys"] == len({key["node"] for _, key in keys if key["weight"] > 0})

    mpnn = result["mpnn_reference"]
    neighbours = {i: list(reference.neighbors(i)) for i in range(45)}
    assert mpnn["mean_hops"] == pytest.approx(np.mean([1.0 for i in range(45) if neighbours[i]]))
    assert mpnn["same_label_rate"] == pytest.approx(
        np.mean([np.mean([y[j] == y[i] for j in neighbours[i]]) for i in range(45)])
    )
    assert mpnn["weight_on_train"] == pytest.approx(
        np.mean([np.mean([train[j] for j in neighbours[i]]) for i in range(45)])
    )
    assert mpnn["hops_histogram"]["1"] == pytest.approx(1.0)


def test_statistics_over_batches_of_graphs_equal_per_graph_computations(monkeypatch):
    monkeypatch.setattr(explain_stats, "CHUNK", 16)
    graphs = [_graph(num_nodes=n, seed=n) for n in (23, 31, 12, 40, 18)]
    model = _model("kmip", heads=2, k=6, num_layers=2)
    result = explain_graphs(model, DataLoader(graphs, batch_size=2), k=6)
    assert result["num_graphs"] == 5 and result["num_queries"] == result["num_nodes"] == 124
    assert [(e["layer"], e["head"]) for e in result["layers"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # Independent reference: each graph alone (attention never crosses graphs), networkx hop counts.
    per_graph = [attended_keys(model, graph, k=6) for graph in graphs]
    lengths = [dict(nx.all_pairs_shortest_path_length(nx.Graph(g.edge_index.t().tolist()))) for g in graphs]
    for entry in result["layers"]:
        layer, head, stats = entry["layer"], entry["head"], entry["stats"]
        weighted_hops, histogram, entropy, distinct = [], np.zeros(HOP_BINS), [], 0
        for selection, hop in zip(per_graph, lengths):
            index, weight = selection[layer].index[:, head], selection[layer].weight[:, head].double()
            for q in range(index.shape[0]):
                for key, w in zip(index[q].tolist(), weight[q].tolist()):
                    h = hop[q].get(key, -1)
                    histogram[h if h >= 0 else HOP_BINS - 1] += w
                    weighted_hops.append((w, h))
                entropy.append(float(torch.special.entr(weight[q]).sum()))
            distinct += len(set(index[weight > 0].tolist()))
        total = histogram.sum()
        assert list(stats["hops_histogram"].values()) == pytest.approx(histogram / total, abs=1e-9)
        reachable = [(w, h) for w, h in weighted_hops if h >= 0]
        mean_hops = sum(w * h for w, h in reachable) / sum(w for w, _ in reachable)
        assert stats["mean_hops"] == pytest.approx(mean_hops)
        beyond = sum(w for w, h in weighted_hops if h > 2 or h < 0) / total
        assert share_beyond(stats["hops_histogram"], 2) == pytest.approx(beyond)
        assert stats["entropy"] == pytest.approx(np.mean(entropy), rel=1e-5)
        assert stats["distinct_keys"] == distinct
        assert stats["same_label_rate"] is None and stats["weight_on_train"] is None
    degree_one = [1.0 for g in lengths for node in g if len(g[node]) > 1]
    assert result["mpnn_reference"]["mean_hops"] == pytest.approx(np.mean(degree_one))


def test_uniform_reference_draws_from_the_query_graph_at_the_analytic_mean_distance():
    # Paths of n nodes: a uniform pair (self included) lies (n^2 - 1) / (3n) hops apart on average.
    sizes = [40, 40, 40, 40, 30, 30]
    graphs = []
    for n in sizes:
        path = torch.stack([torch.arange(n - 1), torch.arange(1, n)])
        graphs.append(Data(x=torch.randn(n, 3), edge_index=path, edge_attr=torch.randn(n - 1, 1)))
    model = _model("kmip", heads=2, k=16, num_layers=1)
    result = explain_graphs(model, DataLoader(graphs, batch_size=4), k=16, seed=3)
    uniform = result["uniform_reference"]
    expected = sum(n * (n * n - 1) / (3 * n) for n in sizes) / sum(sizes)
    # 3,520 draws with a spread of about 10 hops: a standard error of 0.17.
    assert uniform["mean_hops"] == pytest.approx(expected, abs=0.7)
    assert uniform["hops_histogram"][">64"] == 0.0  # a key of another graph would be unreachable
    assert uniform["entropy"] == pytest.approx(math.log(16))
    again = explain_graphs(model, DataLoader(graphs, batch_size=4), k=16, seed=3)["uniform_reference"]
    assert again == uniform


def test_a_virtual_node_is_counted_apart_and_hops_are_those_of_the_graph_without_it(monkeypatch):
    monkeypatch.setattr(explain_stats, "CHUNK", 16)
    plain = [_graph(num_nodes=n, seed=n) for n in (23, 31, 12, 40)]
    graphs = [add_virtual_node(g) for g in plain]
    torch.manual_seed(0)
    model = GraphTransformer(4, 8, 3, num_layers=2, edge_channels=3, attn_kwargs={"heads": 2, "k": 6})
    result = explain_graphs(model, DataLoader(graphs, batch_size=2), k=6, virtual_node=True)
    assert result["num_graphs"] == 4 and result["num_queries"] == result["num_nodes"] == 106
    # Independent reference: each graph alone, its own nodes as queries, networkx hops without the hub.
    per_graph = [attended_keys(model, g, list(range(p.num_nodes)), k=6) for g, p in zip(graphs, plain)]
    lengths = [dict(nx.all_pairs_shortest_path_length(nx.Graph(g.edge_index.t().tolist()))) for g in plain]
    for entry in result["layers"]:
        layer, head, stats = entry["layer"], entry["head"], entry["stats"]
        histogram, on_hub, total, distinct = np.zeros(HOP_BINS), 0.0, 0.0, 0
        for selection, hop, p in zip(per_graph, lengths, plain):
            index, weight = selection[layer].index[:, head], selection[layer].weight[:, head].double()
            for q in range(p.num_nodes):
                for key, w in zip(index[q].tolist(), weight[q].tolist()):
                    total += w
                    if key == p.num_nodes:
                        on_hub += w
                    else:
                        h = hop[q].get(key, -1)
                        histogram[h if h >= 0 else HOP_BINS - 1] += w
            distinct += len(set(index[(weight > 0) & (index != p.num_nodes)].tolist()))
        assert stats["weight_on_virtual_node"] == pytest.approx(on_hub / total)
        assert list(stats["hops_histogram"].values()) == pytest.approx(histogram / histogram.sum(), abs=1e-9)
        assert stats["distinct_keys"] == distinct  # the graphs' own nodes
    # The message passing reads the hub too: 1 / (degree + 1) of each atom's aggregate.
    mpnn = result["mpnn_reference"]
    degrees = [d for g in plain for _, d in nx.Graph(g.edge_index.t().tolist()).degree()]
    assert mpnn["weight_on_virtual_node"] == pytest.approx(np.mean([1 / (d + 1) for d in degrees]))
    assert mpnn["hops_histogram"]["1"] == pytest.approx(1.0) and mpnn["mean_hops"] == 1.0
    uniform = result["uniform_reference"]
    assert uniform["weight_on_virtual_node"] == 0.0 and uniform["hops_histogram"][">64"] == 0.0
    # Without the flag every pair is at most 2 hops apart, through the hub.
    through = explain_graphs(model, DataLoader(graphs, batch_size=2), k=6)["uniform_reference"]
    assert through["mean_hops"] <= 2 < uniform["mean_hops"] and through["weight_on_virtual_node"] is None
    # One graph: the same counts, and the hub is refused as a listed query.
    single = explain(model, graphs[2], torch.arange(13), [0, 4], k=6, virtual_node=True)
    assert single["num_nodes"] == single["num_queries"] == 12
    with pytest.raises(ValueError, match="node 12 is the virtual node"):
        explain(model, graphs[2], torch.arange(13), [0, 12], k=6, virtual_node=True)


def test_without_node_labels_the_label_figures_are_null():
    # A graph of a graph-level task: no node labels, no training mask; hop figures remain.
    graph = _graph(num_nodes=12, seed=5)
    result = explain(_model("full", k=20), graph, torch.arange(12), [3])
    assert result["k"] == 12  # the whole (small) graph: full attention keeps every key
    for entry in result["layers"]:
        (row,) = entry["queries"]
        assert row["label"] is None and row["mass"] == pytest.approx(1.0, rel=1e-5)
        assert all(key["train"] is None and key["same_label"] is None for key in row["keys"])
        stats = entry["stats"]
        assert stats["same_label_rate"] is None and stats["weight_on_train"] is None
        assert stats["base_same_label_rate"] is None and stats["mean_mass"] == pytest.approx(1.0, rel=1e-5)
        assert sum(stats["hops_histogram"].values()) == pytest.approx(1.0)
    assert result["mpnn_reference"]["same_label_rate"] is None


def test_layer_head_and_kind_are_checked():
    graph = _graph()
    with pytest.raises(ValueError, match="layer 2 does not exist"):
        explain(_model(), graph, torch.arange(5), [0], layer=2)
    with pytest.raises(ValueError, match="head 3 does not exist"):
        explain(_model(), graph, torch.arange(5), [0], head=3)
    with pytest.raises(ValueError, match="node 40 is out of range"):
        explain(_model(), graph, torch.arange(5), [40])
    with pytest.raises(ValueError, match=r"'performer'.*no explicit attention weights"):
        attended_keys(_model("performer"), graph)
