"""The fused C++ k-MIP attention (forward and backward) against a dense float64 oracle and kmip_attention."""

import itertools
import warnings

import numpy as np
import pytest
import torch

import kmipgt.ops.fused_attention as fused_attention
from kmipgt.ops import kmip_attention
from kmipgt.ops.cpp_build import find_compiler
from kmipgt.ops.fused_attention import fused_attention_available, fused_kmip_attention

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="needs a C++ compiler")


def _tokens(sizes, heads=2, dim=6, dim_v=None, seed=0, integer=False):
    """Query, key, value ``[N, H, d]`` / ``[N, H, d_v]`` float32 for graphs of ``sizes`` nodes, and ptr.

    ``integer`` draws small integers: float32 products and sums are exact, and tie.
    """
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    ptr = torch.tensor([0, *np.cumsum(sizes, dtype=np.int64).tolist()], dtype=torch.long)

    def draw(width):
        if integer:
            return torch.randint(-3, 4, (n, heads, width), generator=gen).float()
        return torch.randn(n, heads, width, generator=gen)

    return draw(dim), draw(dim), draw(dim_v or dim), ptr


def _oracle(query, key, value, k, ptr, scale):
    """Per graph and head in float64: dense scores, the k best by (score desc, index asc) from a lexicographic
    sort, softmax over them, weighted sum of the values. Returns (out, index, score, weight); out keeps
    the autograd graph of the inputs."""
    q, kk, v = query.double(), key.double(), value.double()
    num_nodes, heads, _ = q.shape
    index = torch.full((num_nodes, heads, k), -1, dtype=torch.long)
    score = torch.full((num_nodes, heads, k), float("-inf"), dtype=torch.float64)
    weight = torch.zeros(num_nodes, heads, k, dtype=torch.float64)
    outs = [v.new_zeros(0, heads, v.shape[-1])]
    for start, end in itertools.pairwise(ptr.tolist()):
        if start == end:
            continue
        logits = torch.einsum("ihd,jhd->hij", q[start:end], kk[start:end])  # [H, n, n]
        raw = logits.detach().numpy()
        positions = np.broadcast_to(np.arange(end - start), raw.shape)
        order = torch.from_numpy(np.lexsort((positions, -raw), axis=-1)[..., :k].copy())  # [H, n, width]
        chosen = torch.zeros(raw.shape, dtype=torch.bool).scatter_(-1, order, True)
        weights = torch.softmax((scale * logits).masked_fill(~chosen, float("-inf")), dim=-1)
        outs.append(torch.einsum("hij,jhd->ihd", weights, v[start:end]))
        width = order.shape[-1]
        index[start:end, :, :width] = order.permute(1, 0, 2) + start
        score[start:end, :, :width] = logits.detach().gather(-1, order).permute(1, 0, 2)
        weight[start:end, :, :width] = weights.detach().gather(-1, order).permute(1, 0, 2)
    return torch.cat(outs), index, score, weight


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_() for t in tensors]


def _check_against_oracle(query, key, value, k, ptr, scale=0.4, exact=False):
    leaves = _leaves(query, key, value)
    out, index, score, weight = fused_kmip_attention(*leaves, k, ptr, scale)
    ref_leaves = _leaves(query.double(), key.double(), value.double())
    ref_out, ref_index, ref_score, ref_weight = _oracle(*ref_leaves, k, ptr, scale)
    assert out.dtype == score.dtype == weight.dtype == torch.float32 and index.dtype == torch.long
    torch.testing.assert_close(index, ref_index, rtol=0, atol=0)
    if exact:  # integer inputs: every inner product is exact in float32
        torch.testing.assert_close(score.double(), ref_score, rtol=0, atol=0)
    torch.testing.assert_close(score.double(), ref_score, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.double(), ref_weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-5, atol=1e-5)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grads = torch.autograd.grad(out, leaves, grad_out)
    ref_grads = torch.autograd.grad(ref_out, ref_leaves, grad_out.double())
    for grad, ref_grad in zip(grads, ref_grads):
        assert grad.dtype == torch.float32
        torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("k", [1, 5, 8, 13, 32, 40])
def test_ragged_batch_matches_the_dense_oracle(k):
    # Uneven graphs, some smaller than k, empty ones (repeated offsets), and d_v != d.
    query, key, value, ptr = _tokens([37, 1, 0, 64, 5, 0, 120, 9], heads=3, dim=7, dim_v=4)
    _check_against_oracle(query, key, value, k, ptr)


@pytest.mark.parametrize("k", [1, 3, 8, 12, 24, 32, 45])
def test_ties_go_to_the_lower_index(k):
    query, key, value, ptr = _tokens([90, 0, 6, 41], heads=2, dim=3, dim_v=5, integer=True)
    _check_against_oracle(query, key, value, k, ptr, exact=True)


@pytest.mark.parametrize("k", [4, 20])
def test_a_graph_spanning_many_score_vectors_matches_the_oracle(k):
    # 700 keys: more than 64 vectors of 8 scores per query row.
    query, key, value, ptr = _tokens([700, 30], heads=1, dim=5, dim_v=3, seed=2)
    _check_against_oracle(query, key, value, k, ptr, scale=1.3)


def test_head_dimensions_below_one_vector_match_the_oracle():
    query, key, value, ptr = _tokens([25, 11], heads=2, dim=3, dim_v=2, seed=3)
    _check_against_oracle(query, key, value, 4, ptr)


def test_graphs_smaller_than_k_are_padded():
    query, key, value, ptr = _tokens([3, 0, 1, 6])
    _, index, score, weight = fused_kmip_attention(query, key, value, 5, ptr, 0.5)
    sizes = torch.tensor([3, 3, 3, 1, 6, 6, 6, 6, 6, 6])
    valid = torch.arange(5) < sizes[:, None, None]
    assert torch.equal(index >= 0, valid.expand_as(index))
    assert bool((score[~valid.expand_as(score)] == float("-inf")).all())
    assert bool((weight[~valid.expand_as(weight)] == 0).all())
    torch.testing.assert_close(weight.sum(-1), torch.ones(10, 2))


def test_a_batch_without_nodes_gives_empty_results():
    query, key, value, ptr = _tokens([0, 0])
    out, index, score, weight = fused_kmip_attention(query.requires_grad_(), key, value, 3, ptr, 1.0)
    assert out.shape == (0, 2, 6) and index.shape == score.shape == weight.shape == (0, 2, 3)
    out.sum().backward()
    assert query.grad.shape == query.shape


def test_matches_kmip_attention_with_the_fused_search():
    query, key, value, ptr = _tokens([50, 13, 0, 77, 2], heads=4, dim=19, seed=5)
    k, scale = 6, 19**-0.5
    leaves, ref_leaves = _leaves(query, key, value), _leaves(query, key, value)
    out, index, score, weight = fused_kmip_attention(*leaves, k, ptr, scale)
    ref_out, selection = kmip_attention(*ref_leaves, k, ptr=ptr, backend="fused", return_selection=True)
    assert torch.equal(index, selection.index)
    assert torch.equal(score, selection.score)  # the same float32 inner products, summed in the same order
    torch.testing.assert_close(weight, selection.weight)
    torch.testing.assert_close(out, ref_out)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(6))
    grads = torch.autograd.grad(out, leaves, grad_out)
    for grad, ref_grad in zip(grads, torch.autograd.grad(ref_out, ref_leaves, grad_out)):
        torch.testing.assert_close(grad, ref_grad)


def _run(query, key, value, k, ptr, grad_out):
    leaves = _leaves(query, key, value)
    out = fused_kmip_attention(*leaves, k, ptr, 0.3)[0]
    return (out, *torch.autograd.grad(out, leaves, grad_out))


@pytest.mark.parametrize("tensor", [0, 1, 2])
def test_a_nan_in_one_graph_leaves_the_other_graphs_unchanged(tensor):
    inputs = list(_tokens([20, 15, 30], heads=2, dim=9))
    ptr = inputs.pop()
    grad_out = torch.randn(65, 2, 9, generator=torch.Generator().manual_seed(7))
    clean = _run(*inputs, 4, ptr, grad_out)
    inputs[tensor] = inputs[tensor].clone()
    inputs[tensor][25, 1, 3] = float("nan")  # a node of the middle graph
    dirty = _run(*inputs, 4, ptr, grad_out)
    others = torch.cat([torch.arange(0, 20), torch.arange(35, 65)])
    for ref, result in zip(clean, dirty):
        assert bool(result[others].isfinite().all())
        assert torch.equal(result[others], ref[others])


def test_every_thread_count_gives_the_same_bits():
    query, key, value, ptr = _tokens([31, 8, 0, 64, 17, 3, 50], heads=3, dim=10, dim_v=6, seed=8)
    grad_out = torch.randn(173, 3, 6, generator=torch.Generator().manual_seed(9))
    threads = torch.get_num_threads()
    try:
        results = []
        for count in (1, 3):
            torch.set_num_threads(count)
            results.append(_run(query, key, value, 5, ptr, grad_out))
    finally:
        torch.set_num_threads(threads)
    for one, several in zip(*results):
        assert torch.equal(one, several)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_is_computed_in_float32(dtype):
    query, key, value, ptr = _tokens([40, 25], heads=2, dim=8, integer=True)
    half = _leaves(query.to(dtype), key.to(dtype), value.to(dtype))
    out, index, score, weight = fused_kmip_attention(*half, 5, ptr, 0.25)
    assert out.dtype == score.dtype == dtype and weight.dtype == torch.float32
    full_out, full_index, _, full_weight = fused_kmip_attention(query, key, value, 5, ptr, 0.25)
    assert torch.equal(index, full_index)  # small integers are exact in half precision
    assert torch.equal(weight, full_weight)
    assert torch.equal(out, full_out.to(dtype))
    out.float().sum().backward()
    assert all(leaf.grad.dtype == dtype for leaf in half)


def test_only_the_inputs_that_need_gradients_get_them():
    query, key, value, ptr = _tokens([12, 30], heads=2, dim=4)
    value = value.requires_grad_()
    out = fused_kmip_attention(query, key, value, 3, ptr, 0.5)[0]
    out.sum().backward()
    assert query.grad is None and key.grad is None
    _, index, _, weight = _oracle(query, key, value, 3, ptr, 0.5)
    # d Σout / d v_j = the sum of the weights with which queries select key j (per head), on every channel.
    expected = torch.zeros(42, 2, dtype=torch.float64)
    expected.index_put_((index, torch.arange(2)[None, :, None].expand_as(index)), weight, accumulate=True)
    torch.testing.assert_close(value.grad, expected.float()[..., None].expand(42, 2, 4))


def test_bad_input_is_refused():
    query, key, value, ptr = _tokens([5, 4])
    with pytest.raises(TypeError, match="query"):
        fused_kmip_attention(query.double(), key.double(), value.double(), 2, ptr, 1.0)
    with pytest.raises(ValueError, match="`k`"):
        fused_kmip_attention(query, key, value, 0, ptr, 1.0)
    with pytest.raises(ValueError, match="`ptr`"):
        fused_kmip_attention(query, key, value, 2, torch.tensor([0, 4, 8]), 1.0)
    with pytest.raises(ValueError, match="`ptr`"):
        fused_kmip_attention(query, key, value, 2, torch.tensor([0, 6, 5, 9]), 1.0)
    with pytest.raises(ValueError, match="same nodes"):
        fused_kmip_attention(query, key[:8], value, 2, ptr, 1.0)


def test_without_a_compiler_it_is_unavailable_and_says_so(monkeypatch):
    try:
        monkeypatch.setattr(fused_attention, "find_compiler", lambda: None)
        fused_attention._library.cache_clear()
        with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
            assert not fused_attention_available()
        query, key, value, ptr = _tokens([5])
        with warnings.catch_warnings(), pytest.raises(RuntimeError, match="could not be built"):
            warnings.simplefilter("ignore")
            fused_kmip_attention(query, key, value, 2, ptr, 1.0)
    finally:
        monkeypatch.undo()
        fused_attention._library.cache_clear()
