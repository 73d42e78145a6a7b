"""CUDA search backends (Triton kernel, IVF on the GPU) against the torch backend; skipped without CUDA."""

import numpy as np
import pytest
import torch

from kmipgt.ops import topk_inner_product
from reference import reference_topk
from ties_at_zero import ties_at_zero

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("sizes", [[300, 5, 0, 2000], [64], [1, 130]])
@pytest.mark.parametrize("k", [1, 16, 100])
@pytest.mark.requires("triton")
def test_triton_matches_torch_backend(ragged, sizes, k):
    query, key, ptr = ragged(sizes, dim=16)
    ref_scores, ref_index = topk_inner_product(query.cuda(), key.cuda(), k, ptr=ptr, backend="torch")
    scores, index = topk_inner_product(query.cuda(), key.cuda(), k, ptr=ptr, backend="triton")
    torch.testing.assert_close(scores, ref_scores, rtol=1e-5, atol=1e-5)
    assert (index == ref_index).float().mean() > 0.999


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.requires("triton")
def test_triton_is_exact_with_ties(ragged, dtype):
    query, key, ptr = ragged([500, 77], dim=5, integer=True)
    scores, index = topk_inner_product(
        query.to("cuda", dtype), key.to("cuda", dtype), 9, ptr=ptr, backend="triton"
    )
    ref_scores, ref_index = reference_topk(query, key, 9, ptr.tolist())
    np.testing.assert_array_equal(index.cpu().numpy(), ref_index)
    np.testing.assert_array_equal(scores.float().cpu().numpy(), ref_scores)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dim", [160, 256])
@pytest.mark.requires("triton")
def test_triton_serves_head_dims_past_128_within_shared_memory(ragged, dim, dtype):
    """Head dims 160 and 256 launch the smaller plan (32 x 32 tiles) without running out of resources."""
    query, key, ptr = ragged([300, 5, 130], dim=dim, integer=True)
    scores, index = topk_inner_product(
        query.to("cuda", dtype), key.to("cuda", dtype), 16, ptr=ptr, backend="triton"
    )
    ref_scores, ref_index = reference_topk(query, key, 16, ptr.tolist())
    np.testing.assert_array_equal(index.cpu().numpy(), ref_index)
    # Ranked on exact float32 sums; returned in the input dtype, where sums past 256 round in bfloat16.
    rounded = torch.from_numpy(ref_scores).to(dtype).float().numpy()
    np.testing.assert_array_equal(scores.float().cpu().numpy(), rounded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.requires("triton")
def test_triton_ranks_ties_at_zero_by_index(dtype):
    """Sums of -0.0 products from the tensor cores tie with +0.0 (the select after the dot)."""
    query, key, _, ptr = ties_at_zero()
    scores, index = topk_inner_product(
        query.to("cuda", dtype), key.to("cuda", dtype), 12, ptr=ptr, backend="triton"
    )
    ref_scores, ref_index = reference_topk(query, key, 12, ptr.tolist())
    np.testing.assert_array_equal(index.cpu().numpy(), ref_index)
    np.testing.assert_array_equal(scores.float().cpu().numpy(), ref_scores)


@pytest.mark.parametrize("backend", ["auto", "ivf"])
def test_k_past_128_on_small_graphs_has_an_exact_route(ragged, backend):
    """k = 200: graphs of 150 nodes go to the torch search, graphs of 60 to Triton with padded slots."""
    for sizes in ([150, 20], [60, 3]):
        query, key, ptr = ragged(sizes, dim=8, integer=True)
        scores, index = topk_inner_product(query.cuda(), key.cuda(), 200, ptr=ptr, backend=backend)
        ref_scores, ref_index = reference_topk(query, key, 200, ptr.tolist())
        np.testing.assert_array_equal(index.cpu().numpy(), ref_index)
        np.testing.assert_array_equal(scores.cpu().numpy(), ref_scores)


def test_auto_uses_an_exact_search_on_cuda(ragged):
    query, key, ptr = ragged([700, 40], integer=True, dim=4)
    _, index = topk_inner_product(query.cuda(), key.cuda(), 8, ptr=ptr)
    np.testing.assert_array_equal(index.cpu().numpy(), reference_topk(query, key, 8, ptr.tolist())[1])


def test_ivf_on_cuda_probing_every_list_is_exact(ragged):
    query, key, ptr = ragged([1500, 30], dim=4, integer=True)
    scores, index = topk_inner_product(
        query.cuda(), key.cuda(), 10, ptr=ptr, backend="ivf", nlist=12, nprobe=12
    )
    ref_scores, ref_index = reference_topk(query, key, 10, ptr.tolist())
    np.testing.assert_array_equal(index.cpu().numpy(), ref_index)
    np.testing.assert_array_equal(scores.cpu().numpy(), ref_scores)


def test_ivf_on_cuda_recall_matches_cpu(ragged):
    query, key, ptr = ragged([4000], heads=1, dim=16)
    _, exact = topk_inner_product(query, key, 16, ptr=ptr)
    _, cpu = topk_inner_product(query, key, 16, ptr=ptr, backend="ivf", nlist=64, nprobe=8)
    _, gpu = topk_inner_product(query.cuda(), key.cuda(), 16, ptr=ptr, backend="ivf", nlist=64, nprobe=8)

    def recall(found):
        return (found[..., :, None] == exact[..., None, :]).any(-1).float().mean().item()

    # Same seed and algorithm; k-means may differ in float rounding, so compare recall, not indices.
    assert abs(recall(gpu.cpu()) - recall(cpu)) < 0.05


def test_fused_backend_refuses_cuda_tensors():
    query = torch.randn(5, 1, 3, device="cuda")
    with pytest.raises(ValueError, match="CPU kernel"):
        topk_inner_product(query, query, 2, backend="fused")
