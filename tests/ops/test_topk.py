import numpy as np
import pytest
import torch

from kmipgt.ops import graph_ptr, topk_inner_product
from reference import reference_topk

BACKENDS = ["torch", "dense"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sizes", [[50], [7, 0, 30, 1, 12], [600, 3, 700]])
@pytest.mark.parametrize("k", [1, 5, 40])
def test_topk_matches_dense_lexsort(ragged, backend, sizes, k):
    query, key, ptr = ragged(sizes, dtype=torch.float64)
    scores, index = topk_inner_product(query, key, k, ptr=ptr, backend=backend)
    ref_scores, ref_index = reference_topk(query, key, k, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)
    np.testing.assert_allclose(scores.numpy(), ref_scores, rtol=1e-12, atol=1e-12)


def test_key_tiles_and_query_tiles_merge_exactly(ragged, monkeypatch):
    import kmipgt.ops.search.blockwise as topk_module

    query, key, ptr = ragged([1500, 900], heads=1, dim=4, dtype=torch.float64)
    monkeypatch.setattr(topk_module, "_TILE_ELEMENTS", {"cpu": 5000})
    monkeypatch.setattr(topk_module, "_KEY_TILE", {"cpu": 128})
    _, index = topk_inner_product(query, key, 9, ptr=ptr)
    _, ref_index = reference_topk(query, key, 9, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_break_by_lower_index(backend, monkeypatch):
    import kmipgt.ops.search.blockwise as topk_module

    monkeypatch.setattr(topk_module, "_KEY_TILE", {"cpu": 16})
    gen = torch.Generator().manual_seed(1)
    # Integer-valued tokens drawn from a tiny set: almost every row has ties at the k-th place,
    # including across key tiles.
    query = torch.randint(-1, 2, (90, 1, 2), generator=gen).double()
    key = torch.randint(-1, 2, (90, 1, 2), generator=gen).double()
    scores, index = topk_inner_product(query, key, 7, backend=backend)
    ref_scores, ref_index = reference_topk(query, key, 7, [0, 90])
    np.testing.assert_array_equal(index.numpy(), ref_index)
    np.testing.assert_array_equal(scores.numpy(), ref_scores)


@pytest.mark.parametrize("backend", ["fused", "ivf"])
@pytest.mark.parametrize("k", [100, 650])
def test_large_k_matches_dense_lexsort_with_ties(ragged, backend, k):
    # k in the hundreds: the fused kernel keeps each query's best keys in a heap, whose order and
    # tie rule must come out as the sorted list's; integer tokens tie at almost every place. IVF probing
    # every list visits the keys list by list, out of id order, through the same kernel.
    query, key, ptr = ragged([600, 3, 700], heads=2, dim=3, integer=True)
    options = {"nlist": 8, "nprobe": 8} if backend == "ivf" else {}
    scores, index = topk_inner_product(query, key, k, ptr=ptr, backend=backend, **options)
    ref_scores, ref_index = reference_topk(query, key, k, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)
    np.testing.assert_array_equal(scores.double().numpy(), ref_scores)


def test_identical_keys_select_lowest_indices():
    query = torch.ones(5, 1, 3)
    key = torch.ones(5, 1, 3)
    _, index = topk_inner_product(query, key, 3)
    assert index[:, 0].tolist() == [[0, 1, 2]] * 5


def test_small_graphs_pad_with_minus_one_and_neg_inf(ragged):
    query, key, ptr = ragged([1, 0, 3], dtype=torch.float64)
    scores, index = topk_inner_product(query, key, 5, ptr=ptr)
    assert index.shape == (4, 2, 5)
    assert index[0, :, 0].tolist() == [0, 0]
    assert (index[0, :, 1:] == -1).all() and torch.isinf(scores[0, :, 1:]).all()
    assert set(index[1:, 0, :3].flatten().tolist()) == {1, 2, 3}
    assert (index[1:, :, 3:] == -1).all()


def test_other_graphs_are_untouched_by_one_graphs_keys(ragged):
    query, key, ptr = ragged([20, 30, 25], dtype=torch.float64)
    _, before = topk_inner_product(query, key, 4, ptr=ptr)
    key = key.clone()
    key[20:50] = torch.randn(30, 2, 6, dtype=key.dtype) * 100
    _, after = topk_inner_product(query, key, 4, ptr=ptr)
    assert torch.equal(before[:20], after[:20]) and torch.equal(before[50:], after[50:])
    assert ((after[20:50] >= 20) & (after[20:50] < 50)).all()


def test_batch_vector_equals_ptr(ragged):
    query, key, ptr = ragged([4, 9, 2], dtype=torch.float64)
    batch = torch.repeat_interleave(torch.arange(3), ptr.diff())
    assert torch.equal(
        topk_inner_product(query, key, 3, batch=batch)[1], topk_inner_product(query, key, 3, ptr=ptr)[1]
    )
    assert torch.equal(graph_ptr(15, ptr=ptr, batch=batch), ptr)


def test_empty_input():
    scores, index = topk_inner_product(torch.empty(0, 2, 4), torch.empty(0, 2, 4), 3)
    assert scores.shape == (0, 2, 3) and index.shape == (0, 2, 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"k": 0}, ValueError, "`k` must be >= 1"),
        ({"k": 2.0}, TypeError, "`k` must be an int"),
        ({"key": torch.randn(6, 2, 4)}, ValueError, "same shape"),
        ({"key": torch.randn(5, 3, 4)}, ValueError, "same shape"),
        ({"query": torch.randn(5, 2)}, ValueError, r"\[N, H, d\]"),
        ({"query": torch.ones(5, 2, 4, dtype=torch.long)}, TypeError, "floating-point"),
        ({"key": torch.randn(5, 2, 4, dtype=torch.float64)}, TypeError, "share dtype"),
        ({"ptr": torch.tensor([1, 5])}, ValueError, "start at 0"),
        ({"ptr": torch.tensor([0, 3, 2, 5])}, ValueError, "non-decreasing"),
        ({"ptr": torch.tensor([0, 4])}, ValueError, "end at the number of nodes"),
        ({"ptr": torch.tensor([0.0, 5.0])}, TypeError, "integers"),
        ({"batch": torch.tensor([0, 1, 0, 1, 1])}, ValueError, "sorted"),
        ({"batch": torch.tensor([0, 0, 1])}, ValueError, "one entry per node"),
        ({"batch": torch.tensor([-1, 0, 0, 0, 0])}, ValueError, "non-negative"),
        ({"ptr": torch.tensor([0, 2, 5]), "batch": torch.tensor([0, 0, 0, 1, 1])}, ValueError, "different"),
        ({"backend": "magic"}, ValueError, "`backend` must be one of"),
    ],
)
def test_bad_input_names_the_argument(kwargs, error, match):
    args = {"query": torch.randn(5, 2, 4), "key": torch.randn(5, 2, 4), "k": 2}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        topk_inner_product(args.pop("query"), args.pop("key"), args.pop("k"), **args)


def test_keops_backend_reports_missing_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "pykeops", None)
    monkeypatch.setitem(sys.modules, "pykeops.torch", None)
    with pytest.raises(ImportError, match=r"kmipgt\[keops\]"):
        topk_inner_product(torch.randn(5, 1, 3), torch.randn(5, 1, 3), 2, backend="keops")


@pytest.mark.requires("pykeops")
def test_keops_backend_matches_reference(ragged):
    query, key, ptr = ragged([40, 25], dtype=torch.float32)
    scores, index = topk_inner_product(query, key, 6, ptr=ptr, backend="keops")
    ref_scores, ref_index = reference_topk(query, key, 6, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)
    np.testing.assert_allclose(scores.numpy(), ref_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.cuda
@pytest.mark.cuda
def test_cuda_matches_cpu(ragged):
    query, key, ptr = ragged([300, 5, 2000], dtype=torch.float32)
    cpu_scores, cpu_index = topk_inner_product(query, key, 16, ptr=ptr)
    gpu_scores, gpu_index = topk_inner_product(query.cuda(), key.cuda(), 16, ptr=ptr.cuda())
    torch.testing.assert_close(gpu_scores.cpu(), cpu_scores, rtol=1e-4, atol=1e-4)
    assert (gpu_index.cpu() == cpu_index).float().mean() > 0.999
