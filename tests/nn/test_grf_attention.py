"""GRFAttention module: dense reference, walk caching and sharing, ragged batches, gradients."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from kmipgt.nn import GraphTransformer, GRFAttention, share_walk_caches


def _edge_index(graph: nx.Graph, offset: int = 0) -> torch.Tensor:
    edges = np.array(graph.edges(), dtype=np.int64).reshape(-1, 2).T + offset
    return torch.from_numpy(np.concatenate([edges, edges[::-1]], axis=1))


def _two_graphs():
    edge_index = torch.cat([_edge_index(nx.cycle_graph(6)), _edge_index(nx.path_graph(5), 6)], dim=1)
    batch = torch.tensor([0] * 6 + [1] * 5)
    return edge_index, batch


@pytest.mark.parametrize("explicit_mask", [None, False, True])
def test_forward_equals_dense_masked_attention(explicit_mask):
    torch.manual_seed(0)
    module = GRFAttention(
        8,
        heads=2,
        num_walks=3,
        max_len=4,
        feature_map="elu",
        global_weight=0.2,
        seed=0,
        explicit_mask=explicit_mask,
    )
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    out = module(x, batch=batch, edge_index=edge_index)

    walks = module.core.walks(edge_index, 11)
    phi = torch.stack(
        [sum(module.core.f[h, t] * walks.step_matrix(t).to_dense() for t in range(5)) for h in range(2)]
    )
    mask = phi @ phi.transpose(1, 2) + 0.2 * (batch[:, None] == batch[None, :]).float()
    q, k, v = (lin(x).view(11, 2, 4) for lin in (module.lin_query, module.lin_key, module.lin_value))
    kernel = (
        torch.einsum("ihd,jhd->hij", torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1) * mask
    )
    attended = torch.einsum("hij,jhe->ihe", kernel, v) / kernel.sum(-1).T[..., None]
    torch.testing.assert_close(out, module.lin_out(attended.reshape(11, 8)), rtol=1e-4, atol=1e-5)


def test_asymmetric_softmax_form_equals_dense_attention_masked_by_features():
    torch.manual_seed(1)
    module = GRFAttention(
        8, heads=2, num_walks=3, max_len=4, feature_map="softmax", form="asymmetric", seed=0
    )
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    out = module(x, batch=batch, edge_index=edge_index)
    walks = module.core.walks(edge_index, 11)
    mask = torch.stack(
        [sum(module.core.f[h, t] * walks.step_matrix(t).to_dense() for t in range(5)) for h in range(2)]
    )
    q, k, v = (lin(x).view(11, 2, 4) for lin in (module.lin_query, module.lin_key, module.lin_value))
    kernel = torch.exp(torch.einsum("ihd,jhd->hij", q, k) / 2.0) * mask
    attended = torch.einsum("hij,jhe->ihe", kernel, v) / kernel.sum(-1).T[..., None]
    torch.testing.assert_close(out, module.lin_out(attended.reshape(11, 8)), rtol=1e-4, atol=1e-5)


def test_walks_are_cached_for_a_fixed_graph_and_resampled_for_a_new_one():
    module = GRFAttention(8, heads=2, seed=0)
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    module(x, batch=batch, edge_index=edge_index)
    first = module.core.walks(edge_index, 11)
    module(x, batch=batch, edge_index=edge_index.clone())
    assert module.core.walks(edge_index, 11) is first
    module(x, batch=batch, edge_index=edge_index[:, 2:])
    assert module.core.walks(edge_index[:, 2:], 11) is not first


def test_graphs_in_a_batch_do_not_see_each_other():
    module = GRFAttention(8, heads=2, global_weight=0.5, seed=0)
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    before = module(x, batch=batch, edge_index=edge_index)
    x2 = x.clone()
    x2[6:] += 10 * torch.randn(5, 8)
    after = module(x2, batch=batch, edge_index=edge_index)
    torch.testing.assert_close(after[:6], before[:6])
    assert not torch.allclose(after[6:], before[6:])


def test_gradients_reach_f_and_projections():
    module = GRFAttention(8, heads=2, feature_map="favor+", global_weight=0.1, seed=0)
    edge_index, batch = _two_graphs()
    module(torch.randn(11, 8), batch=batch, edge_index=edge_index).pow(2).sum().backward()
    assert module.core.theta.grad is not None and bool(module.core.theta.grad.abs().sum() > 0)
    assert all(p.grad is not None for p in module.parameters())


def test_reset_and_redraw():
    module = GRFAttention(8, heads=2, max_len=3, f_decay=0.5, feature_map="favor+")
    torch.testing.assert_close(module.core.f, torch.exp(-0.5 * torch.arange(4.0)).expand(2, 4))
    before = module.core.projection.clone()
    module.core.redraw_projection()
    assert not torch.equal(before, module.core.projection)
    GRFAttention(8, heads=2, feature_map="relu").core.redraw_projection()  # nothing to redraw: no error
    assert "GRFAttention(8, heads=2" in repr(module)


def _counting_rows(monkeypatch, chunk_nodes=4):
    """Count the node chunks of GRFAttention's inference route, with chunks of ``chunk_nodes`` nodes."""
    import kmipgt.nn.attention as attention

    calls = []
    rows = attention.normalised_kernel_attention_rows

    def counted(*args, **kwargs):
        calls.append(args[2].shape[0])  # the chunk's queries
        return rows(*args, **kwargs)

    monkeypatch.setattr(attention, "normalised_kernel_attention_rows", counted)
    monkeypatch.setattr(attention, "default_chunk_rows", lambda *args: chunk_nodes)
    return calls


@pytest.mark.parametrize("heads", [1, 2])
@pytest.mark.parametrize("chunk_nodes", [4, 11, 64])
@pytest.mark.parametrize("separate_qk", [True, False])
def test_inference_runs_in_node_chunks_and_equals_dense_attention_and_the_autograd_route(
    monkeypatch, heads, chunk_nodes, separate_qk
):
    torch.manual_seed(0)
    qk_options = {"qk_channels": 5, "qk_dim": 3} if separate_qk else {}
    module = GRFAttention(8, heads=heads, num_walks=3, max_len=4, seed=0, explicit_mask=True, **qk_options)
    with torch.no_grad():
        module.core.theta.normal_()  # a different mask per head
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    qk_x = torch.randn(11, 5) if separate_qk else None
    calls = _counting_rows(monkeypatch, chunk_nodes)
    with torch.no_grad():
        out = module(x, batch=batch, edge_index=edge_index, qk_x=qk_x)
    expected_chunks = [min(chunk_nodes, 11 - start) for start in range(0, 11, chunk_nodes)]
    assert calls == expected_chunks
    with torch.inference_mode():
        assert torch.equal(module(x, batch=batch, edge_index=edge_index, qk_x=qk_x), out)
    assert calls == 2 * expected_chunks

    autograd = module(x, batch=batch, edge_index=edge_index, qk_x=qk_x)
    assert calls == 2 * expected_chunks and autograd.requires_grad
    torch.testing.assert_close(out, autograd.detach(), rtol=1e-6, atol=1e-6)
    walks = module.core.walks(edge_index, 11)
    phi = torch.stack(
        [sum(module.core.f[h, t] * walks.step_matrix(t).to_dense() for t in range(5)) for h in range(heads)]
    )
    qk_dim, head_dim = module.qk_dim, module.head_dim
    qk_input = x if qk_x is None else qk_x
    q, k = (lin(qk_input).view(11, heads, qk_dim) for lin in (module.lin_query, module.lin_key))
    kernel = torch.einsum("ihd,jhd->hij", q.relu(), k.relu()) * (phi @ phi.transpose(1, 2))
    attended = torch.einsum("hij,jhe->ihe", kernel, module.lin_value(x).view(11, heads, head_dim))
    attended = attended / (kernel.sum(-1).T[..., None] + 1e-6)
    expected = module.lin_out(attended.reshape(11, heads * head_dim)).detach()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "options",
    [{"feature_map": "elu"}, {"global_weight": 0.2}, {"explicit_mask": False}, {"form": "asymmetric"}],
)
def test_inference_on_other_routes_takes_the_autograd_route(monkeypatch, options):
    module = GRFAttention(8, heads=2, num_walks=3, max_len=4, seed=0, **options)
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    calls = _counting_rows(monkeypatch)
    with torch.no_grad():
        out = module(x, batch=batch, edge_index=edge_index)
    assert calls == []
    assert torch.equal(out, module(x, batch=batch, edge_index=edge_index).detach())


def test_bad_input_is_rejected():
    module = GRFAttention(8, heads=2)
    with pytest.raises(ValueError, match="edge_index"):
        module(torch.randn(4, 8))
    with torch.no_grad(), pytest.raises(ValueError, match="edge_index"):
        module(torch.randn(4, 8))
    with pytest.raises(ValueError, match="x"):
        module(torch.randn(4, 7), edge_index=torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="heads"):
        GRFAttention(9, heads=2)
    with pytest.raises(ValueError, match="feature_map"):
        GRFAttention(8, feature_map="softmax")
    with pytest.raises(ValueError, match="global_weight"):
        GRFAttention(8, feature_map="softmax", form="asymmetric", global_weight=0.1)


def _grf_model(share_walks=True, seed=0, **kwargs):
    torch.manual_seed(0)
    attn_kwargs = {"seed": seed, "share_walks": share_walks, "max_len": 4, **kwargs}
    return GraphTransformer(8, 16, 3, num_layers=3, attention="grf", attn_kwargs=attn_kwargs)


def _cores(model):
    return [layer.attention.core for layer in model.layers]


def test_model_layers_share_one_walk_cache_and_one_set_of_walks():
    model = _grf_model()
    edge_index, batch = _two_graphs()
    assert len({id(core.walk_cache) for core in _cores(model)}) == 1
    model(torch.randn(11, 8), edge_index, batch)
    walks = _cores(model)[0].walks(edge_index, 11)
    assert all(core.walks(edge_index, 11) is walks for core in _cores(model))
    assert _cores(model)[0].walk_cache.graphs_sampled == 1
    # Each layer keeps its own modulation f.
    assert len({id(core.theta) for core in _cores(model)}) == 3


def test_shared_walks_give_the_outputs_and_gradients_of_per_layer_walks_with_the_same_seed():
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    results = []
    for share in (True, False):
        model = _grf_model(share, explicit_mask=True)
        assert len({id(core.walk_cache) for core in _cores(model)}) == (1 if share else 3)
        out = model(x, edge_index, batch)
        out.square().sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.detach(), grads))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=0, atol=0)
    assert results[0][1].keys() == results[1][1].keys() and any("theta" in n for n in results[0][1])
    for name, grad in results[0][1].items():
        torch.testing.assert_close(grad, results[1][1][name], rtol=0, atol=0, msg=name)


def test_shared_walks_are_resampled_for_a_changed_graph_and_after_reset():
    model = _grf_model(seed=None)
    edge_index, batch = _two_graphs()
    x = torch.randn(11, 8)
    cache = _cores(model)[0].walk_cache
    model(x, edge_index, batch)
    first = cache.walks(edge_index, 11)
    model(x, edge_index.clone(), batch)  # the same graph in another tensor: no resampling
    assert cache.walks(edge_index, 11) is first and cache.graphs_sampled == 1
    changed = edge_index.clone()
    changed[:, :2] = changed[:, :2].flip(0)  # a different graph with the same shape
    model(x, changed, batch)
    second = _cores(model)[-1].walks(changed, 11)
    assert second is not first and cache.graphs_sampled == 2
    assert all(core.walks(changed, 11) is second for core in _cores(model))
    changed[0, 0] = changed[1, 0]  # changed in place: the cache holds a copy, not the caller's tensor
    assert cache.walks(changed, 11) is not second
    model.reset_parameters()
    assert cache._walks is None and all(core.walk_cache is cache for core in _cores(model))


def test_cores_with_other_walk_settings_or_share_walks_false_keep_their_own_cache():
    modules = torch.nn.ModuleList(
        [GRFAttention(8, heads=2, seed=0), GRFAttention(8, heads=2, seed=0, feature_map="elu"),
         GRFAttention(8, heads=2, seed=0, max_len=3), GRFAttention(8, heads=2, seed=0, share_walks=False)]
    )
    assert share_walk_caches(modules) == 2
    caches = [module.core.walk_cache for module in modules]
    assert caches[0] is caches[1]  # the feature map is not a walk setting
    assert len({id(cache) for cache in caches}) == 3
