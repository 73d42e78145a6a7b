"""`kmipgt bench approx`: k-MIP vs full attention on trained tokens, against dense references."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

import kmipgt.bench.approx as approx
from kmipgt.analysis.tokens import collect_tokens, kmip_layers, load_tokens, save_tokens
from kmipgt.cli import main
from kmipgt.nn import GraphTransformer
from kmipgt.ops import kmip_attention, topk_inner_product
from reference import reference_attention, reference_topk
from tiny_runs import train_tiny_city


def _tokens(num_nodes=60, heads=2, dim=4, dim_v=3, seed=0, spread=2.0):
    gen = torch.Generator().manual_seed(seed)
    # Spread-out logits make attention peaked, so the curves move visibly with k.
    query = spread * torch.randn(num_nodes, heads, dim, generator=gen, dtype=torch.float64)
    key = torch.randn(num_nodes, heads, dim, generator=gen, dtype=torch.float64)
    value = torch.randn(num_nodes, heads, dim_v, generator=gen, dtype=torch.float64)
    return query, key, value


def _dense_curves(query, key, value, k):
    """Error, mass and overlap per head from explicit softmax matrices and numpy's top-k."""
    n, heads, dim = query.shape
    full = reference_attention(query, key, value, n, [0, n])
    sparse = reference_attention(query, key, value, k, [0, n])
    _, index = reference_topk(query, key, k, [0, n])
    error, mass = [], []
    for h in range(heads):
        weights = torch.softmax(query[:, h] @ key[:, h].T / dim**0.5, dim=-1).numpy()
        mass.append(np.take_along_axis(weights, index[:, h], axis=1).sum(1).mean())
        error.append(float((sparse[:, h] - full[:, h]).norm() / full[:, h].norm()))
    return np.array(error), np.array(mass)


@pytest.mark.parametrize("block_elements", [1 << 22, 50])
def test_curves_match_dense_softmax_and_numpy_top_k(monkeypatch, block_elements):
    # A tiny block budget splits the queries into many blocks: the sums over blocks must not change.
    monkeypatch.setattr(approx, "_BLOCK_ELEMENTS", block_elements)
    query, key, value = _tokens()
    ks = [1, 2, 5, 17, 60]
    curves = approx.approximation_curves(query, key, value, ks)
    for row, k in enumerate(ks):
        error, mass = _dense_curves(query, key, value, k)
        np.testing.assert_allclose(curves["error"][row].numpy(), error, rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(curves["mass"][row].numpy(), mass, rtol=1e-9)
        np.testing.assert_array_equal(curves["overlap"][row].numpy(), 1.0)
    # k = N is full attention: no error, all the mass.
    assert curves["error"][-1].abs().max() < 1e-12
    np.testing.assert_allclose(curves["mass"][-1].numpy(), 1.0, rtol=1e-12)
    assert bool((curves["mass"].diff(dim=0) >= 0).all()), "captured mass must not decrease with k"


def test_without_the_search_selection_the_dense_top_k_gives_the_same_curves(monkeypatch):
    query, key, value = _tokens(seed=1)
    ks = [1, 3, 8, 60]
    searched = approx.approximation_curves(query, key, value, ks)
    monkeypatch.setattr(approx, "_SELECTION_ELEMENTS", 0)
    dense = approx.approximation_curves(query, key, value, ks)
    torch.testing.assert_close(dense["error"], searched["error"])
    torch.testing.assert_close(dense["mass"], searched["mass"])
    assert bool(dense["overlap"].isnan().all())


def test_overlap_is_the_recall_of_an_approximate_search():
    query, key, value = (t.float() for t in _tokens(num_nodes=1100, heads=1, dim=4, seed=2))
    ks = [4, 16]
    curves = approx.approximation_curves(query, key, value, ks, backend="ivf")
    for row, k in enumerate(ks):
        _, found = topk_inner_product(query, key, k, backend="ivf")
        _, exact = reference_topk(query, key, k, [0, 1100])
        hits = [len(set(found[i, 0].tolist()) & set(exact[i, 0].tolist())) for i in range(1100)]
        assert curves["overlap"][row, 0].item() == pytest.approx(np.mean(hits) / k, rel=1e-12)
    assert 0.2 < curves["overlap"].min() < 1.0  # the index misses some keys here, not all


def test_k_grid_defaults_to_powers_of_two_and_n():
    assert approx.k_grid(1) == [1]
    assert approx.k_grid(8) == [1, 2, 4, 8]
    assert approx.k_grid(10) == [1, 2, 4, 8, 10]
    assert approx.k_grid(10, [10, 3, 3]) == [3, 10]
    for bad in ([], [0], [11], [2.5]):
        with pytest.raises(ValueError, match="k"):
            approx.k_grid(10, bad)
    with pytest.raises(ValueError, match=r"1\.\.60"):
        approx.approximation_curves(*_tokens(), [1, 61])


def _graph(num_nodes=30, seed=0) -> Data:
    gen = torch.Generator().manual_seed(seed)
    ring = torch.stack([torch.arange(num_nodes), (torch.arange(num_nodes) + 1) % num_nodes])
    return Data(
        x=torch.randn(num_nodes, 3, generator=gen), edge_index=ring, edge_attr=torch.ones(num_nodes, 1)
    )


def _model(attention="kmip", k=4, seed=0) -> GraphTransformer:
    torch.manual_seed(seed)
    return GraphTransformer(
        3, 8, 2, num_layers=3, edge_channels=1, attention=attention,
        attn_kwargs={"heads": 2, "layers": [0, 2], **({"k": k} if attention == "kmip" else {})},
    )


def _output(model, graph):
    model.eval()
    with torch.no_grad():
        return model(graph.x, graph.edge_index, edge_attr=graph.edge_attr)


def test_tokens_are_what_each_layer_attends_with_and_round_trip(tmp_path):
    graph, model = _graph(), _model()
    outputs = {}
    hooks = [
        model.layers[n].attention.register_forward_hook(lambda m, a, out, n=n: outputs.__setitem__(n, out))
        for n in (0, 2)
    ]
    tokens = collect_tokens(model, graph)
    for hook in hooks:
        hook.remove()
    assert [t.layer for t in tokens] == [0, 2] and {t.k for t in tokens} == {4}
    for entry in tokens:
        module = model.layers[entry.layer].attention
        assert entry.query.shape == entry.value.shape == (30, 2, 4)
        # Attending with the dumped tokens reproduces the layer's own output.
        out = kmip_attention(entry.query, entry.key, entry.value, entry.k)
        torch.testing.assert_close(module.lin_out(out.reshape(30, 8)), outputs[entry.layer])
    save_tokens(tmp_path / "tokens.pt", tokens, dataset="toy")
    for saved, loaded in zip(tokens, load_tokens(tmp_path / "tokens.pt")):
        assert vars(saved).keys() == vars(loaded).keys()
        for name, value in vars(saved).items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, loaded.__dict__[name])
            else:
                assert value == loaded.__dict__[name]


def test_inference_k_at_n_and_the_full_attention_swap_agree_and_restore():
    graph, model = _graph(), _model()
    trained = _output(model, graph)
    with approx.inference_k(model, 30):
        at_n = _output(model, graph)
        assert {m.k for m in kmip_layers(model).values()} == {30}
    with approx.full_attention_swap(model):
        full = _output(model, graph)
        assert not any(type(layer.attention).__name__ == "KMIPAttention" for layer in model.layers)
    torch.testing.assert_close(at_n, full)
    assert not torch.allclose(trained, full)
    torch.testing.assert_close(_output(model, graph), trained)  # both contexts restored the model
    assert {m.k for m in kmip_layers(model).values()} == {4}
    with pytest.raises(ValueError, match="no k-MIP attention layer"):
        kmip_layers(_model(attention="full"))


@pytest.mark.slow
def test_cli_on_a_trained_synthetic_city(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    run = tmp_path / "run"
    train_tiny_city(run, num_nodes=300)
    capsys.readouterr()
    out = tmp_path / "approx"
    code = main(["bench", "approx", str(run), "--out", str(out), "--no-progress", "--save-tokens"])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    result = json.loads((out / "approx.json").read_text())
    ks = [1, 2, 4, 8, 16, 32, 64, 128, 256, 300]
    assert result["ks"] == ks and result["num_nodes"] == 300 and result["trained_k"] == 16
    assert len(result["records"]) == 2 * 4 * len(ks)  # layers × heads × k
    for row in result["layers"]:
        if row["k"] == 300:
            assert row["error"] < 1e-5 and row["mass"] == pytest.approx(1.0, abs=1e-6)
        assert row["overlap"] == pytest.approx(1.0)
    metric = result["metric"]
    assert [row["k"] for row in metric["inference_k"]] == ks
    at_n = metric["inference_k"][-1]
    assert at_n["val"] == pytest.approx(metric["full_attention"]["val"], abs=1e-12)
    assert at_n["test"] == pytest.approx(metric["full_attention"]["test"], abs=1e-12)
    trained = json.loads((run / "metrics.json").read_text())
    at_trained = next(row for row in metric["inference_k"] if row["k"] == 16)
    assert at_trained["test"] == pytest.approx(trained["test"], abs=1e-12)
    for name in ("approx.png", "approx_metric.png"):
        assert (out / name).stat().st_size > 1000
    assert [t.layer for t in load_tokens(out / "tokens.pt")] == [0, 1]

    none_run = tmp_path / "none"
    train_tiny_city(none_run, attention="none", num_nodes=300)
    capsys.readouterr()
    cases = [
        ((none_run,), "no k-MIP attention layer"),
        ((run, "--k", "0,4"), "1..300"),
        ((run, "--k", "301"), "301"),
        ((tmp_path / "missing",), "config.yaml"),
    ]
    for args, named in cases:
        bad_out = tmp_path / "bad"
        code = main(["bench", "approx", *map(str, args), "--out", str(bad_out), "--no-progress"])
        printed = capsys.readouterr()
        assert code == 2, args
        assert printed.err.startswith("kmipgt: error: ") and named in printed.err, printed.err
        assert printed.err.count("\n") == 1 and not bad_out.exists()


@pytest.mark.cuda
def test_curves_on_a_gpu_equal_the_cpu_curves():
    query, key, value = (t.float() for t in _tokens(num_nodes=300, seed=3))
    ks = [1, 7, 300]
    on_cpu = approx.approximation_curves(query, key, value, ks)
    on_gpu = approx.approximation_curves(query.cuda(), key.cuda(), value.cuda(), ks)
    for name in ("error", "mass", "overlap"):
        assert on_gpu[name].device.type == "cpu"
        torch.testing.assert_close(on_gpu[name], on_cpu[name], rtol=1e-4, atol=1e-6)
