"""M queries against N keys: ``key_ptr``/``key_batch`` lay the keys out in graphs of their own.

Query i of graph g searches (and attends to) the keys of graph g; checked against dense references per graph
(numpy selection, ``scaled_dot_product_attention`` with M_g queries and N_g keys, float64 autograd).
"""

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kmipgt.ops.search.backends.fused_search as fused_backend
import kmipgt.ops.search.backends.ivf_search as ivf_search
import kmipgt.ops.search.backends.triton_search as triton_backend
import kmipgt.ops.search.ivf_common as ivf_common
import kmipgt.ops.search.registry as registry
from kmipgt.ops import full_attention, kmip_attention, topk_inner_product
from kmipgt.ops.search.blockwise import topk_blockwise
from kmipgt.ops.search.cuda_device import SM90_SHARED_MEMORY
from kmipgt.ops.search.fused_kernel import fused_library
from reference import reference_topk

SUPPORTING = ("torch", "dense", "fused")  # the exact ones; "ivf" is tested on its own below
UNSUPPORTING = tuple(name for name in registry.registered_backends() if name not in (*SUPPORTING, "ivf"))
# Query and key counts per graph: M_g != N_g, graphs without queries, without keys, with fewer keys than k
# (k = 4 below), and a first graph larger than a block (512 rows), so it runs alone (unmasked) and the
# others together (masked).
QUERY_SIZES = [600, 5, 0, 7, 3, 2, 4]
KEY_SIZES = [530, 9, 4, 0, 2, 1, 6]
# More layouts: large graphs without keys or without queries (blocks of one side only), a block of several
# graphs that ends in a large one, small graphs only, a single graph.
LAYOUTS = [
    (QUERY_SIZES, KEY_SIZES),
    ([700, 0, 3, 2], [0, 600, 9, 1]),
    ([3, 0, 700], [0, 5, 640]),
    ([4, 6, 1], [2, 9, 3]),
    ([900], [20]),
]


def _ptr(sizes):
    return torch.tensor([0, *itertools.accumulate(sizes)])


def _tokens(sizes, dim=5, heads=2, dtype=torch.float64, seed=0, integer=False):
    gen = torch.Generator().manual_seed(seed)
    shape = (sum(sizes), heads, dim)
    if integer:  # small integers: float32 products are exact, so every backend ranks (and ties) alike
        return torch.randint(-3, 4, shape, generator=gen).to(dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def _inputs(query_sizes=QUERY_SIZES, key_sizes=KEY_SIZES, **kwargs):
    query = _tokens(query_sizes, seed=1, **kwargs)
    key, value = _tokens(key_sizes, seed=2, **kwargs), _tokens(key_sizes, seed=3, **kwargs)
    return query, key, value, _ptr(query_sizes), _ptr(key_sizes)


def _reference_attention(query, key, value, k, ptr, key_ptr):
    """Dense masked softmax per graph (differentiable): -inf outside the reference top-k; 0 without keys."""
    _, index = reference_topk(query.detach(), key.detach(), k, ptr, key_ptr)
    scale = query.shape[-1] ** -0.5
    rows = []
    for g in range(len(ptr) - 1):
        (q0, q1), (k0, k1) = ptr[g : g + 2].tolist(), key_ptr[g : g + 2].tolist()
        if k1 == k0:
            rows.append(value.new_zeros(q1 - q0, value.shape[1], value.shape[2]) + 0 * query[q0:q1, :, :1])
            continue
        logits = scale * torch.einsum("mhd,nhd->hmn", query[q0:q1], key[k0:k1])
        local = torch.from_numpy(index[q0:q1]).permute(1, 0, 2) - k0
        # Padding slots (-1) mark an extra column, dropped after.
        local = torch.where(local >= 0, local, k1 - k0)
        mask = logits.new_zeros(*logits.shape[:2], k1 - k0 + 1, dtype=torch.bool).scatter_(-1, local, True)
        mask = mask[..., :-1]
        weights = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
        rows.append(torch.einsum("hmn,nhd->mhd", weights, value[k0:k1]))
    return torch.cat(rows)


def _per_graph_sdpa(query, key, value, ptr, key_ptr):
    """``scaled_dot_product_attention`` per graph with its M_g queries and N_g keys (0 without keys)."""
    rows = []
    for g in range(len(ptr) - 1):
        (q0, q1), (k0, k1) = ptr[g : g + 2].tolist(), key_ptr[g : g + 2].tolist()
        if k1 == k0:
            rows.append(value.new_zeros(q1 - q0, value.shape[1], value.shape[2]))
            continue
        q, k, v = (t.transpose(0, 1) for t in (query[q0:q1], key[k0:k1], value[k0:k1]))
        rows.append(F.scaled_dot_product_attention(q, k, v).transpose(0, 1))
    return torch.cat(rows)


def _assert_topk_equal(result, expected):
    np.testing.assert_array_equal(result[1].numpy(), expected[1])
    np.testing.assert_allclose(result[0].double().numpy(), expected[0], rtol=1e-6)


@pytest.mark.parametrize("backend", [*SUPPORTING, "auto"])
@pytest.mark.parametrize(("query_sizes", "key_sizes"), LAYOUTS)
def test_topk_searches_each_querys_own_key_graph(backend, query_sizes, key_sizes):
    query, key, _, ptr, key_ptr = _inputs(query_sizes, key_sizes, dtype=torch.float32, integer=True)
    result = topk_inner_product(query, key, 4, ptr=ptr, key_ptr=key_ptr, backend=backend)
    assert result[0].shape == result[1].shape == (query.shape[0], 2, 4)
    _assert_topk_equal(result, reference_topk(query, key, 4, ptr, key_ptr))


def test_key_batch_is_key_ptr():
    # Batch ids give the same G here: the last graph has both queries and keys.
    query, key, _, ptr, key_ptr = _inputs(dtype=torch.float32)
    graphs = torch.arange(len(QUERY_SIZES))
    batch = graphs.repeat_interleave(torch.tensor(QUERY_SIZES))
    key_batch = graphs.repeat_interleave(torch.tensor(KEY_SIZES))
    expected = topk_inner_product(query, key, 4, ptr=ptr, key_ptr=key_ptr)
    result = topk_inner_product(query, key, 4, batch=batch, key_batch=key_batch)
    assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])


def test_fused_without_its_kernel_falls_back_with_the_key_layout(monkeypatch):
    monkeypatch.setattr(fused_backend, "fused_library", lambda: None)
    query, key, _, ptr, key_ptr = _inputs(dtype=torch.float32, integer=True)
    result = topk_inner_product(query, key, 4, ptr=ptr, key_ptr=key_ptr, backend="fused")
    _assert_topk_equal(result, reference_topk(query, key, 4, ptr, key_ptr))


@pytest.mark.parametrize(("tile_elements", "key_tile"), [(64, 3), (1000, 7), (None, None)])
def test_blockwise_tiles_merge_across_key_tiles(tile_elements, key_tile):
    query, key, _, ptr, key_ptr = _inputs(dtype=torch.float64)
    result = topk_blockwise(query, key, 4, ptr, tile_elements, key_tile, key_ptr=key_ptr)
    _assert_topk_equal(result, reference_topk(query, key, 4, ptr, key_ptr))


@pytest.mark.parametrize("backend", [*SUPPORTING, "auto"])
def test_no_queries_or_no_keys_at_all(backend):
    key = _tokens([3, 4], dtype=torch.float32)
    scores, index = topk_inner_product(
        key[:0], key, 2, ptr=torch.tensor([0, 0, 0]), key_ptr=torch.tensor([0, 3, 7]), backend=backend
    )
    assert scores.shape == index.shape == (0, 2, 2)
    query = key[:5]
    scores, index = topk_inner_product(
        query, key[:0], 2, ptr=torch.tensor([0, 2, 5]), key_ptr=torch.tensor([0, 0, 0]), backend=backend
    )
    assert bool((index == -1).all()) and bool((scores == float("-inf")).all())


@pytest.mark.parametrize("backend", [*SUPPORTING, "auto", "ivf"])
def test_the_queries_layout_given_for_the_keys_is_todays_path(backend):
    query, key, _, ptr, _ = _inputs(QUERY_SIZES, QUERY_SIZES, dtype=torch.float32)
    expected = topk_inner_product(query, key, 4, ptr=ptr, backend=backend)
    result = topk_inner_product(query, key, 4, ptr=ptr, key_ptr=ptr.clone(), backend=backend)
    assert torch.equal(result[0], expected[0]) and torch.equal(result[1], expected[1])
    _, key_plus, value, _, _ = _inputs(QUERY_SIZES, QUERY_SIZES, dtype=torch.float64)
    query64 = query.double()
    for function, args in ((kmip_attention, (4,)), (full_attention, ())):
        plain = function(query64, key_plus, value, *args, ptr=ptr)
        assert torch.equal(function(query64, key_plus, value, *args, ptr=ptr, key_ptr=ptr), plain)


@pytest.mark.parametrize("backend", UNSUPPORTING)
def test_a_backend_without_key_layouts_names_those_with(backend):
    query, key, value, ptr, key_ptr = _inputs(dtype=torch.float32)
    with pytest.raises(
        ValueError, match=rf"backend {backend!r}.*\('auto', 'torch', 'dense', 'fused', 'ivf'\)"
    ):
        topk_inner_product(query, key, 4, ptr=ptr, key_ptr=key_ptr, backend=backend)
    with pytest.raises(ValueError, match=f"backend {backend!r}"):
        kmip_attention(query, key, value, 4, ptr=ptr, key_ptr=key_ptr, backend=backend)


def test_auto_picks_the_fastest_backend_that_takes_key_layouts(monkeypatch):
    def auto(device_type, dtype, queries_differ=False):
        call = registry.SearchCall(device_type, dtype, 4, 16, 100, queries_differ, SM90_SHARED_MEMORY)
        return registry.route(call).name

    expected_cpu = "fused" if fused_library() is not None else "torch"
    assert auto("cpu", torch.float32, queries_differ=True) == expected_cpu
    assert auto("cpu", torch.float64, queries_differ=True) == "torch"
    # On CUDA `auto` is `triton` for M == N; the Triton kernel takes no key layout, so `torch`.
    monkeypatch.setattr(triton_backend, "triton_available", lambda: True)
    assert auto("cuda", torch.float32) == "triton"
    assert auto("cuda", torch.float32, queries_differ=True) == "torch"


def test_auto_skips_a_faster_backend_without_key_layouts(monkeypatch):
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))

    def refuse(*args, **kwargs):
        raise AssertionError("auto must not pick a backend without key layouts")

    eager = registry.SearchBackend("eager", refuse, exact=True, available=lambda: True, auto_rank=-1)
    registry.register(eager)
    query, key, _, ptr, key_ptr = _inputs(dtype=torch.float32, integer=True)
    result = topk_inner_product(query, key, 4, ptr=ptr, key_ptr=key_ptr)
    _assert_topk_equal(result, reference_topk(query, key, 4, ptr, key_ptr))


@pytest.mark.parametrize(
    ("query_rows", "kwargs", "error", "match"),
    [
        (7, {}, ValueError, "same shape.*7 queries and 9 keys"),
        (7, {"ptr": torch.tensor([0, 7])}, ValueError, "same shape"),
        (7, {"key_ptr": torch.tensor([0, 4, 9])}, ValueError, "same number of graphs, got 1 and 2"),
        (7, {"key_ptr": torch.tensor([0, 8])}, ValueError, "key layout.*end at the number of nodes \\(9\\)"),
        (7, {"key_batch": torch.tensor([1, 0] * 4 + [1])}, ValueError, "key layout.*sorted"),
        (7, {"key_ptr": torch.tensor([0.0, 9.0])}, TypeError, "key layout.*integers"),
        (
            7,
            {"key_ptr": torch.tensor([0, 9]), "key_batch": torch.tensor([0] * 5 + [1] * 4)},
            ValueError,
            "key layout.*different graphs",
        ),
    ],
)
def test_bad_key_layouts_name_the_argument(query_rows, kwargs, error, match):
    query, key = torch.randn(query_rows, 2, 4), torch.randn(9, 2, 4)
    with pytest.raises(error, match=match):
        topk_inner_product(query, key, 2, **kwargs)
    with pytest.raises(error, match=match):
        kmip_attention(query, key, torch.randn(9, 2, 3), 2, **kwargs)


def test_values_follow_the_keys():
    query, key = torch.randn(7, 2, 4), torch.randn(9, 2, 4)
    layout = {"ptr": torch.tensor([0, 7]), "key_ptr": torch.tensor([0, 9])}
    with pytest.raises(ValueError, match=r"`value` must have shape \[N, H, d_v\] = \[9, 2, d_v\]"):
        kmip_attention(query, key, torch.randn(7, 2, 3), 2, **layout)
    with pytest.raises(ValueError, match=r"\[9, 2, d_v\]"):
        full_attention(query, key, torch.randn(7, 2, 3), **layout)


@pytest.mark.parametrize("backend", [*SUPPORTING, "auto"])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize(("query_sizes", "key_sizes"), LAYOUTS[:3])
def test_kmip_attention_and_its_gradients_match_a_dense_reference(backend, k, query_sizes, key_sizes):
    dtype = torch.float32 if backend == "fused" else torch.float64
    query, key, value, ptr, key_ptr = _inputs(query_sizes, key_sizes, dtype=dtype, integer=backend == "fused")
    tensors = [t.clone().requires_grad_() for t in (query, key, value)]
    ref_tensors = [t.double().clone().requires_grad_() for t in (query, key, value)]
    layout = {"ptr": ptr, "key_ptr": key_ptr}
    out, selection = kmip_attention(*tensors, k, **layout, backend=backend, return_selection=True)
    expected = _reference_attention(*ref_tensors, k, ptr, key_ptr)
    assert out.shape == (query.shape[0], 2, 5) and selection.index.shape == (query.shape[0], 2, k)
    assert selection.index.max() < key.shape[0]
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(out.double(), expected, **tolerance)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    torch.autograd.backward(out, grad.to(dtype))
    torch.autograd.backward(expected, grad)
    for name, tensor, reference in zip(("query", "key", "value"), tensors, ref_tensors):
        assert tensor.grad.shape == tensor.shape, name
        torch.testing.assert_close(tensor.grad.double(), reference.grad, **tolerance, msg=name)


def test_queries_of_a_graph_without_keys_get_zero_output_and_gradient():
    query, key, value, ptr, key_ptr = _inputs()
    query.requires_grad_()
    no_keys = slice(int(ptr[3]), int(ptr[4]))  # graph 3: 7 queries, 0 keys
    for function, args in ((kmip_attention, (4,)), (full_attention, ())):
        out = function(query, key, value, *args, ptr=ptr, key_ptr=key_ptr)
        (grad,) = torch.autograd.grad(out.sum(), query)
        assert bool((out[no_keys] == 0).all()) and bool((grad[no_keys] == 0).all())
        assert bool(torch.isfinite(grad).all())


def test_no_keys_at_all_gives_zeros_and_an_empty_selection():
    query = torch.randn(5, 2, 4)
    out, selection = kmip_attention(
        query,
        query[:0],
        torch.randn(0, 2, 3),
        4,
        ptr=torch.tensor([0, 5]),
        key_ptr=torch.tensor([0, 0]),
        return_selection=True,
    )
    assert torch.equal(out, torch.zeros(5, 2, 3)) and selection.index.shape == (5, 2, 0)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_k_covering_every_key_graph_is_full_attention(backend):
    query, key, value, ptr, key_ptr = _inputs()
    expected = _per_graph_sdpa(query, key, value, ptr, key_ptr)
    out = kmip_attention(query, key, value, max(KEY_SIZES), ptr=ptr, key_ptr=key_ptr, backend=backend)
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(("query_sizes", "key_sizes"), LAYOUTS)
def test_full_attention_and_its_gradients_match_sdpa_per_graph(query_sizes, key_sizes):
    query, key, value, ptr, key_ptr = _inputs(query_sizes, key_sizes)
    tensors = [t.clone().requires_grad_() for t in (query, key, value)]
    ref_tensors = [t.clone().requires_grad_() for t in (query, key, value)]
    out = full_attention(*tensors, ptr=ptr, key_ptr=key_ptr)
    expected = _per_graph_sdpa(*ref_tensors, ptr, key_ptr)
    torch.testing.assert_close(out, expected)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(5), dtype=out.dtype)
    torch.autograd.backward(out, grad)
    torch.autograd.backward(expected, grad)
    for name, tensor, reference in zip(("query", "key", "value"), tensors, ref_tensors):
        assert tensor.grad.shape == tensor.shape, name
        torch.testing.assert_close(tensor.grad, reference.grad, msg=name)


# IVF indexes for the graphs of at least 100 keys (M < N, M > N), exact search for the small one, a graph
# without queries and one without keys.
IVF_QUERY_SIZES = [30, 250, 0, 7, 60]
IVF_KEY_SIZES = [200, 120, 150, 0, 40]


@pytest.mark.parametrize("probe_kernel", ["fused", "torch"])
def test_ivf_probing_every_list_is_exact_with_a_key_layout(probe_kernel, monkeypatch):
    if probe_kernel == "torch":
        monkeypatch.setattr(ivf_search, "fused_library", lambda: None)
    monkeypatch.setattr(ivf_common, "IVF_MIN_NODES", 100)
    query, key, value, ptr, key_ptr = _inputs(
        IVF_QUERY_SIZES, IVF_KEY_SIZES, dtype=torch.float32, integer=True
    )
    result = topk_inner_product(query, key, 12, ptr=ptr, key_ptr=key_ptr, backend="ivf", nlist=6, nprobe=6)
    _assert_topk_equal(result, reference_topk(query, key, 12, ptr, key_ptr))
    layout = {"ptr": ptr, "key_ptr": key_ptr}
    out = kmip_attention(query, key, value, 12, **layout, backend="ivf", nlist=6, nprobe=6)
    torch.testing.assert_close(out, kmip_attention(query, key, value, 12, **layout, backend="torch"))


def test_ivf_with_a_key_layout_finds_most_keys_and_scores_them_exactly(monkeypatch):
    monkeypatch.setattr(ivf_common, "IVF_MIN_NODES", 100)
    query, key, _, ptr, key_ptr = _inputs([300, 40], [900, 700], dtype=torch.float32)
    _, ref_index = reference_topk(query, key, 10, ptr, key_ptr)
    scores, index = topk_inner_product(
        query, key, 10, ptr=ptr, key_ptr=key_ptr, backend="ivf", nlist=16, nprobe=4
    )
    found = index >= 0
    recall = np.mean(
        [len(set(a) & set(b)) / 10 for a, b in zip(index.flatten(0, 1).tolist(), ref_index.reshape(-1, 10))]
    )
    assert 0.3 < recall < 1.0
    heads = torch.arange(2)[None, :, None]
    true_scores = (query[:, :, None] * key[index.clamp_min(0), heads]).sum(-1)
    torch.testing.assert_close(scores[found], true_scores[found])
