"""O(N) GRF-masked attention against dense attention built from the same Φ̂."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from kmipgt.grf import (
    apply_feature_map,
    asymmetric_masked_attention,
    grf_feature_values,
    grf_features,
    grf_mask,
    grf_mask_pattern,
    linear_attention,
    masked_linear_attention,
    orthogonal_random_features,
    pattern_masked_attention,
    sample_walks,
)
from kmipgt.ops.ragged import RaggedLayout
from sync_detector import HostSyncs

HEADS, DIM, DIM_V = 2, 4, 3


def _edge_index(graph: nx.Graph, offset: int = 0) -> torch.Tensor:
    edges = np.array(graph.edges(), dtype=np.int64).reshape(-1, 2).T + offset
    return torch.from_numpy(np.concatenate([edges, edges[::-1]], axis=1))


def _batch():
    """Three graphs in one block-diagonal batch: ``(edge_index, ptr)``."""
    graphs = [nx.path_graph(5), nx.cycle_graph(7), nx.star_graph(4)]
    sizes = [g.number_of_nodes() for g in graphs]
    ptr = torch.tensor([0, *np.cumsum(sizes)])
    edge_index = torch.cat([_edge_index(g, int(o)) for g, o in zip(graphs, ptr[:-1], strict=True)], dim=1)
    return edge_index, ptr


def _inputs(n: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(n, HEADS, DIM, generator=gen, dtype=torch.float64)
    k = torch.randn(n, HEADS, DIM, generator=gen, dtype=torch.float64)
    v = torch.randn(n, HEADS, DIM_V, generator=gen, dtype=torch.float64)
    return q, k, v


def _dense_masked(q, k, v, mask, phi_q, phi_k):
    """Reference: ``(M ⊙ φ(Q)φ(K)ᵀ) V`` row-normalised, per head (mask ``[H, N, N]``)."""
    kernel = torch.einsum("ihm,jhm->hij", phi_q, phi_k) * mask
    numerator = torch.einsum("hij,jhe->ihe", kernel, v)
    return numerator / kernel.sum(-1).T[..., None]


def _graph_blocks(ptr: torch.Tensor) -> torch.Tensor:
    graph = torch.repeat_interleave(torch.arange(ptr.numel() - 1), ptr.diff())
    return (graph[:, None] == graph[None, :]).double()


@pytest.fixture(scope="module")
def walks_and_ptr():
    edge_index, ptr = _batch()
    walks = sample_walks(
        edge_index, int(ptr[-1]), num_walks=3, p_halt=0.3, max_len=4, seed=0, ptr=ptr, dtype=torch.float64
    )
    return walks, ptr


@pytest.mark.parametrize("feature_map", ["relu", "elu", "favor+"])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("global_weight", [0.0, 0.3])
@pytest.mark.parametrize("explicit_mask", [False, True])
def test_symmetric_form_equals_dense_masked_attention(
    walks_and_ptr, feature_map, per_head, global_weight, explicit_mask
):
    walks, ptr = walks_and_ptr
    pattern = grf_mask_pattern(walks) if explicit_mask else None
    n = walks.num_nodes
    q, k, v = _inputs(n)
    f = torch.rand(HEADS, 5, dtype=torch.float64) if per_head else torch.rand(5, dtype=torch.float64)
    features = grf_features(walks, f)
    projection = None
    if feature_map == "favor+":
        gen = torch.Generator().manual_seed(1)
        projection = orthogonal_random_features(6, DIM, generator=gen, dtype=torch.float64)
    out = masked_linear_attention(
        q,
        k,
        v,
        features,
        feature_map=feature_map,
        projection=projection,
        global_weight=global_weight,
        ptr=ptr,
        eps=0.0,
    )
    phi = features.to_dense()
    phi = phi if per_head else phi.expand(HEADS, n, n)
    mask = phi @ phi.transpose(1, 2) + global_weight * _graph_blocks(ptr)
    phi_q = apply_feature_map(q, feature_map, projection=projection, is_query=True)
    phi_k = apply_feature_map(k, feature_map, projection=projection, is_query=False)
    if feature_map == "relu":
        phi_q, phi_k = phi_q + 1e-3, phi_k + 1e-3  # keep every row's mass positive
        out = masked_linear_attention(
            q.relu() + 1e-3,
            k.relu() + 1e-3,
            v,
            features,
            global_weight=global_weight,
            ptr=ptr,
            eps=0.0,
            mask_pattern=pattern,
        )
    torch.testing.assert_close(out, _dense_masked(q, k, v, mask, phi_q, phi_k))


def test_favor_features_estimate_the_softmax_kernel():
    gen = torch.Generator().manual_seed(0)
    q, k, _ = (0.5 * t for t in _inputs(6))  # FAVOR+ variance grows like exp(‖q + k‖² / √d)
    projection = orthogonal_random_features(4096, DIM, generator=gen, dtype=torch.float64)
    phi_q = apply_feature_map(q, "favor+", projection=projection, is_query=True)
    phi_k = apply_feature_map(k, "favor+", projection=projection, is_query=False)
    approx = torch.einsum("ihm,jhm->hij", phi_q, phi_k)
    exact = torch.exp(torch.einsum("ihd,jhd->hij", q, k) / DIM**0.5)
    # The stabilising shifts scale row i by a constant: compare row-normalised kernels.
    approx, exact = approx / approx.sum(-1, keepdim=True), exact / exact.sum(-1, keepdim=True)
    assert float((approx - exact).abs().max()) < 0.05


@pytest.mark.parametrize("score", ["softmax", "elu", "favor+"])
def test_asymmetric_form_equals_dense_attention_masked_by_features(walks_and_ptr, score):
    walks, _ = walks_and_ptr
    n = walks.num_nodes
    q, k, v = _inputs(n, seed=1)
    features = grf_features(walks, torch.rand(HEADS, 5, dtype=torch.float64))
    projection = None
    if score == "favor+":
        projection = orthogonal_random_features(
            6, DIM, generator=torch.Generator().manual_seed(2), dtype=torch.float64
        )
    out = asymmetric_masked_attention(q, k, v, features, score=score, projection=projection, eps=0.0)
    mask = features.to_dense()
    if score == "softmax":
        kernel = torch.exp(torch.einsum("ihd,jhd->hij", q, k) / DIM**0.5) * mask
        expected = torch.einsum("hij,jhe->ihe", kernel, v) / kernel.sum(-1).T[..., None]
    else:
        phi_q = apply_feature_map(q, score, projection=projection, is_query=True)
        phi_k = apply_feature_map(k, score, projection=projection, is_query=False)
        expected = _dense_masked(q, k, v, mask, phi_q, phi_k)
    torch.testing.assert_close(out, expected)


def test_asymmetric_global_term_is_per_graph(walks_and_ptr):
    walks, ptr = walks_and_ptr
    q, k, v = _inputs(walks.num_nodes, seed=2)
    features = grf_features(walks, torch.rand(5, dtype=torch.float64))
    out = asymmetric_masked_attention(q, k, v, features, score="elu", global_weight=0.5, ptr=ptr, eps=0.0)
    mask = features.to_dense().expand(HEADS, -1, -1) + 0.5 * _graph_blocks(ptr)
    phi_q, phi_k = apply_feature_map(q, "elu"), apply_feature_map(k, "elu")
    torch.testing.assert_close(out, _dense_masked(q, k, v, mask, phi_q, phi_k))
    with pytest.raises(ValueError, match="global_weight"):
        asymmetric_masked_attention(q, k, v, features, score="softmax", global_weight=0.5)


def test_symmetric_form_equals_edge_list_over_explicit_mask(walks_and_ptr):
    """Materialising M̂ = Φ̂Φ̂ᵀ and running the edge-list kernel gives the SpMM result."""
    walks, _ = walks_and_ptr
    q, k, v = _inputs(walks.num_nodes, seed=3)
    features = grf_features(walks, torch.rand(HEADS, 5, dtype=torch.float64))
    dense = features.to_dense()
    explicit = (dense @ dense.transpose(1, 2)).to_sparse()
    symmetric = masked_linear_attention(q, k, v, features, feature_map="elu")
    torch.testing.assert_close(symmetric, asymmetric_masked_attention(q, k, v, explicit, score="elu"))


@pytest.mark.parametrize("per_head", [False, True])
def test_explicit_mask_equals_dense_feature_product(walks_and_ptr, per_head):
    walks, _ = walks_and_ptr
    f = torch.rand(HEADS, 5, dtype=torch.float64) if per_head else torch.rand(5, dtype=torch.float64)
    features = grf_features(walks, f)
    dense = features.to_dense()
    mask = grf_mask(features, grf_mask_pattern(walks))
    assert mask.is_coalesced()
    torch.testing.assert_close(mask.to_dense(), dense @ dense.transpose(-1, -2))


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("global_weight", [0.0, 0.3])
def test_attention_from_feature_values_equals_the_sparse_route(walks_and_ptr, per_head, global_weight):
    """pattern_masked_attention (no sparse Φ̂) is the explicit-mask route, bit for bit."""
    walks, ptr = walks_and_ptr
    pattern = grf_mask_pattern(walks)
    f = torch.rand(HEADS, 5, dtype=torch.float64) if per_head else torch.rand(5, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (*_inputs(walks.num_nodes, seed=4), f)]
    options = {"feature_map": "relu", "global_weight": global_weight, "ptr": ptr}
    outs = [
        masked_linear_attention(*inputs[:3], grf_features(walks, inputs[3]), mask_pattern=pattern, **options),
        pattern_masked_attention(*inputs[:3], grf_feature_values(walks, inputs[3]), pattern, **options),
    ]
    grads = [torch.autograd.grad(out.sum(), inputs) for out in outs]
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    with pytest.raises(ValueError, match="feature_values"):
        pattern_masked_attention(*inputs[:3], torch.ones(HEADS + 1, pattern.num_features), pattern)
    with pytest.raises(TypeError, match="mask_pattern"):
        pattern_masked_attention(*inputs[:3], grf_feature_values(walks, f), None)


def test_delta_f_gives_self_attention_only(walks_and_ptr):
    walks, _ = walks_and_ptr
    q, k, v = _inputs(walks.num_nodes, seed=4)
    delta = torch.tensor([2.0, 0, 0, 0, 0], dtype=torch.float64)
    features = grf_features(walks, delta)
    torch.testing.assert_close(masked_linear_attention(q, k, v, features, feature_map="elu", eps=0.0), v)
    torch.testing.assert_close(asymmetric_masked_attention(q, k, v, features), v)


def test_batched_output_equals_per_graph_runs(walks_and_ptr):
    walks, ptr = walks_and_ptr
    q, k, v = _inputs(walks.num_nodes, seed=5)
    dense = grf_features(walks, torch.rand(5, dtype=torch.float64)).to_dense()
    batched = masked_linear_attention(
        q, k, v, dense.to_sparse(), feature_map="elu", global_weight=0.2, ptr=ptr
    )
    for lo, hi in zip(ptr[:-1].tolist(), ptr[1:].tolist(), strict=True):
        block = dense[lo:hi, lo:hi].to_sparse()
        alone = masked_linear_attention(
            q[lo:hi], k[lo:hi], v[lo:hi], block, feature_map="elu", global_weight=0.2
        )
        torch.testing.assert_close(batched[lo:hi], alone)
    batch = torch.repeat_interleave(torch.arange(3), ptr.diff())
    by_batch = masked_linear_attention(
        q, k, v, dense.to_sparse(), feature_map="elu", global_weight=0.2, batch=batch
    )
    torch.testing.assert_close(by_batch, batched)


def test_unmasked_linear_attention_matches_dense_per_graph(walks_and_ptr):
    _, ptr = walks_and_ptr
    q, k, v = _inputs(int(ptr[-1]), seed=6)
    phi_q, phi_k = apply_feature_map(q, "elu"), apply_feature_map(k, "elu")
    expected = _dense_masked(q, k, v, _graph_blocks(ptr).expand(HEADS, -1, -1), phi_q, phi_k)
    torch.testing.assert_close(linear_attention(q, k, v, feature_map="elu", ptr=ptr, eps=0.0), expected)
    single = _dense_masked(q, k, v, torch.ones(HEADS, q.shape[0], q.shape[0], dtype=q.dtype), phi_q, phi_k)
    torch.testing.assert_close(linear_attention(q, k, v, feature_map="elu", eps=0.0), single)


def test_gradients_match_finite_differences(walks_and_ptr):
    walks, ptr = walks_and_ptr
    q, k, v = (t.requires_grad_() for t in _inputs(walks.num_nodes, seed=7))
    theta = torch.randn(HEADS, 5, dtype=torch.float64, requires_grad=True)

    def symmetric(theta, q, k, v):
        features = grf_features(walks, torch.nn.functional.softplus(theta))
        return masked_linear_attention(q, k, v, features, feature_map="elu", global_weight=0.1, ptr=ptr)

    def asymmetric(theta, q, k, v):
        features = grf_features(walks, torch.nn.functional.softplus(theta))
        return asymmetric_masked_attention(q, k, v, features)

    pattern = grf_mask_pattern(walks)

    def explicit(theta, q, k, v):
        features = grf_features(walks, torch.nn.functional.softplus(theta))
        return masked_linear_attention(q, k, v, features, feature_map="elu", mask_pattern=pattern)

    assert torch.autograd.gradcheck(symmetric, (theta, q, k, v), fast_mode=True)
    assert torch.autograd.gradcheck(explicit, (theta, q, k, v), fast_mode=True)
    assert torch.autograd.gradcheck(asymmetric, (theta, q, k, v), fast_mode=True)


def test_isolated_nodes_and_relu_zero_rows_give_no_nan():
    walks = sample_walks(torch.tensor([[0, 1], [1, 0]]), 4, num_walks=2, p_halt=0.5, max_len=2, seed=0)
    q, k, v = (t.float() for t in _inputs(4))
    features = grf_features(walks, torch.tensor([1.0, 0.5, 0.25]))
    out = masked_linear_attention(-q.abs(), k, v, features)  # relu(q) = 0: no mass anywhere
    assert torch.isfinite(out).all() and torch.equal(out, torch.zeros_like(out))
    assert torch.isfinite(asymmetric_masked_attention(q, k, v, features)).all()


def test_bad_inputs_are_rejected(walks_and_ptr):
    walks, _ = walks_and_ptr
    n = walks.num_nodes
    q, k, v = _inputs(n)
    features = grf_features(walks, torch.rand(5, dtype=torch.float64))
    with pytest.raises(TypeError, match="features"):
        masked_linear_attention(q, k, v, features.to_dense())
    with pytest.raises(ValueError, match="features"):
        masked_linear_attention(q[:-1], k[:-1], v[:-1], features)
    with pytest.raises(ValueError, match="feature_map"):
        masked_linear_attention(q, k, v, features, feature_map="tanh")
    with pytest.raises(ValueError, match="projection"):
        masked_linear_attention(q, k, v, features, feature_map="favor+")
    with pytest.raises(ValueError, match="key"):
        masked_linear_attention(q, k[..., :2], v, features)


def test_favor_linear_attention_is_per_graph_when_one_graph_scores_far_below_another():
    """The key stabiliser is per graph: a graph whose logits lie ~200 below another's keeps its weights."""
    gen = torch.Generator().manual_seed(0)
    projection = orthogonal_random_features(16, DIM, generator=gen, dtype=torch.float64)
    query, key, value = (
        torch.randn(12, HEADS, d, generator=gen, dtype=torch.float64) for d in (DIM, DIM, DIM_V)
    )
    key[:6] = key[:6] * 0.1 + 20.0 * projection[0] / projection[0].norm()  # graph 0: large key logits
    ptr = torch.tensor([0, 6, 12])
    batched = linear_attention(query, key, value, feature_map="favor+", projection=projection, ptr=ptr)
    for lo, hi in ((0, 6), (6, 12)):
        alone = linear_attention(
            query[lo:hi], key[lo:hi], value[lo:hi], feature_map="favor+", projection=projection
        )
        torch.testing.assert_close(batched[lo:hi], alone)


def _favor_inputs(num_nodes: int):
    gen = torch.Generator().manual_seed(1)
    projection = orthogonal_random_features(16, DIM, generator=gen, dtype=torch.float64)
    tokens = (torch.randn(num_nodes, HEADS, d, generator=gen, dtype=torch.float64) for d in (DIM, DIM, DIM_V))
    return (*tokens, projection)


def test_linear_attention_with_the_batch_layout_reads_nothing_back_and_matches_each_graph_alone():
    ptr = torch.tensor([0, 5, 5, 12, 15, 15])  # empty graphs inside and at the end
    query, key, value, projection = _favor_inputs(15)
    batch = torch.repeat_interleave(torch.arange(5), ptr.diff())
    layout = RaggedLayout(ptr)
    with HostSyncs([query, key, value, projection, batch]) as syncs:
        out = linear_attention(query, key, value, feature_map="favor+", projection=projection, layout=layout)
    assert syncs.syncs == []
    torch.testing.assert_close(
        out, linear_attention(query, key, value, feature_map="favor+", projection=projection, batch=batch),
        rtol=0, atol=0,
    )
    for lo, hi in ((0, 5), (5, 12), (12, 15)):
        alone = linear_attention(
            query[lo:hi], key[lo:hi], value[lo:hi], feature_map="favor+", projection=projection
        )
        torch.testing.assert_close(out[lo:hi], alone)


@pytest.mark.parametrize("given", ["layout", "batch"])
def test_favor_keys_of_a_batch_with_more_empty_graphs_than_nodes(given):
    # Graph ids run past the node count: the per-graph key shift has a row per graph, not per node.
    ptr = torch.tensor([0, 0, 0, 0, 2])
    query, key, value, projection = _favor_inputs(2)
    ragged = {"layout": RaggedLayout(ptr)} if given == "layout" else {"batch": torch.tensor([3, 3])}
    out = linear_attention(query, key, value, feature_map="favor+", projection=projection, **ragged)
    torch.testing.assert_close(
        out, linear_attention(query, key, value, feature_map="favor+", projection=projection)
    )


def test_linear_attention_takes_a_layout_of_its_inputs_only():
    query, key, value, _ = _favor_inputs(6)
    ptr = torch.tensor([0, 6])
    with pytest.raises(ValueError, match="either `layout` or `ptr`/`batch`"):
        linear_attention(query, key, value, layout=RaggedLayout(ptr), ptr=ptr)
    with pytest.raises(ValueError, match="`layout` holds 5 nodes, the inputs 6"):
        linear_attention(query, key, value, layout=RaggedLayout(torch.tensor([0, 5])))
