"""The fast search backends (fused C++, Triton, IVF, faiss) against the dense numpy reference."""

import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

import kmipgt
import kmipgt.ops.search.backends.ivf_search as ivf_search
import kmipgt.ops.search.fused_kernel as fused_search
import kmipgt.ops.search.ivf_common as ivf_common
from kmipgt.ops import kmip_attention, topk_inner_product
from reference import reference_attention, reference_topk


def _recall(index, ref_index):
    valid = ref_index >= 0
    hits = (index[..., :, None] == ref_index[..., None, :]).any(-2) & valid
    return hits.sum() / valid.sum()


def _assert_selects_reference_scores(query, key, ptr, k, scores, index):
    """The selected keys carry the reference top-k scores (robust to float32 near-ties)."""
    ref_scores, ref_index = reference_topk(query, key, k, ptr.tolist())
    assert np.array_equal(index.numpy() < 0, ref_index < 0)
    heads = np.arange(query.shape[1])[None, :, None]
    chosen = np.einsum(
        "nhkd,nhd->nhk", key.double().numpy()[np.maximum(index.numpy(), 0), heads], query.double().numpy()
    )
    np.testing.assert_allclose(
        np.where(ref_index < 0, 0, chosen), np.where(ref_index < 0, 0, ref_scores), rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(scores.numpy(), ref_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("sizes", [[50], [7, 0, 30, 1, 300], [1000, 3]])
@pytest.mark.parametrize("k", [1, 16, 40])
def test_fused_selects_the_reference_top_k(ragged, sizes, k):
    # dim 64 makes the 1000-node graph span several key tiles of the kernel.
    query, key, ptr = ragged(sizes, heads=2, dim=64 if max(sizes) >= 1000 else 6)
    scores, index = topk_inner_product(query, key, k, ptr=ptr, backend="fused")
    _assert_selects_reference_scores(query, key, ptr, k, scores, index)


def test_fused_breaks_ties_by_lower_index_exactly(ragged):
    query, key, ptr = ragged([90, 5, 400], heads=3, dim=3, integer=True)
    scores, index = topk_inner_product(query, key, 9, ptr=ptr, backend="fused")
    ref_scores, ref_index = reference_topk(query, key, 9, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)
    np.testing.assert_array_equal(scores.numpy(), ref_scores)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fused_takes_half_precision(ragged, dtype):
    query, key, ptr = ragged([40, 25], integer=True)
    scores, index = topk_inner_product(query.to(dtype), key.to(dtype), 5, ptr=ptr, backend="fused")
    _, ref_index = reference_topk(query, key, 5, ptr.tolist())
    assert scores.dtype == dtype
    np.testing.assert_array_equal(index.numpy(), ref_index)


def test_auto_is_exact_for_float64_and_float32(ragged):
    query, key, ptr = ragged([33, 64], integer=True)
    for dtype in (torch.float64, torch.float32):
        _, index = topk_inner_product(query.to(dtype), key.to(dtype), 4, ptr=ptr)
        np.testing.assert_array_equal(index.numpy(), reference_topk(query, key, 4, ptr.tolist())[1])


def test_fused_rejects_float64():
    query = torch.randn(5, 1, 3, dtype=torch.float64)
    with pytest.raises(TypeError, match="backend='torch'"):
        topk_inner_product(query, query, 2, backend="fused")


def _rebuild_library(monkeypatch, **patches):
    for name, value in patches.items():
        monkeypatch.setattr(fused_search, name, value)
    fused_search.fused_library.cache_clear()


def test_fused_falls_back_to_torch_with_a_warning_without_compiler(ragged, monkeypatch):
    query, key, ptr = ragged([20, 30])
    try:
        _rebuild_library(monkeypatch, _compiler=lambda: None)
        with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler"):
            scores, index = topk_inner_product(query, key, 3, ptr=ptr, backend="fused")
        _assert_selects_reference_scores(query, key, ptr, 3, scores, index)
    finally:
        monkeypatch.undo()
        fused_search.fused_library.cache_clear()


def test_failed_build_warns_and_falls_back(ragged, monkeypatch, tmp_path):
    query, key, _ = ragged([20])
    try:
        monkeypatch.setenv("KMIPGT_CACHE", str(tmp_path))
        _rebuild_library(monkeypatch, _FLAGS=(*fused_search._FLAGS, "--no-such-flag"))
        with pytest.warns(RuntimeWarning, match="could not build the fused CPU search"):
            _, index = topk_inner_product(query, key, 3, backend="fused")
        np.testing.assert_array_equal(index.numpy(), reference_topk(query, key, 3, [0, 20])[1])
        assert not list(tmp_path.glob("*.so"))
    finally:
        monkeypatch.undo()
        fused_search.fused_library.cache_clear()


def test_built_library_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("KMIPGT_CACHE", str(tmp_path))
    assert fused_search.cache_dir() == tmp_path
    fused_search.fused_library.cache_clear()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert fused_search.fused_library() is not None
        assert len(list(tmp_path.glob("fused_topk-*.so"))) == 1
    finally:
        monkeypatch.undo()
        fused_search.fused_library.cache_clear()


@pytest.mark.parametrize("probe_kernel", ["fused", "torch"])
def test_ivf_probing_every_list_is_exact(ragged, probe_kernel, monkeypatch):
    if probe_kernel == "torch":
        monkeypatch.setattr(ivf_search, "fused_library", lambda: None)
    monkeypatch.setattr(ivf_common, "IVF_MIN_NODES", 100)
    # Integer tokens: exact float32 arithmetic and many ties, so the index must match to the last tie.
    query, key, ptr = ragged([200, 50, 0, 130], heads=2, dim=4, integer=True)
    scores, index = topk_inner_product(query, key, 12, ptr=ptr, backend="ivf", nlist=6, nprobe=6)
    ref_scores, ref_index = reference_topk(query, key, 12, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)
    np.testing.assert_array_equal(scores.numpy(), ref_scores)


@pytest.mark.parametrize("route", ["fused", "torch"])
@pytest.mark.parametrize("count", [1, 7])
def test_ivf_centroid_selection_matches_brute_force(route, count, monkeypatch):
    if route == "torch":
        monkeypatch.setattr(ivf_search, "fused_library", lambda: None)
    gen = torch.Generator().manual_seed(3)
    points, centroids = torch.randn(500, 9, generator=gen), torch.randn(40, 9, generator=gen)
    nearest = ivf_search._nearest_centroids(points, centroids, count)
    expected = torch.cdist(points.double(), centroids.double()).topk(count, largest=False).indices
    np.testing.assert_array_equal(nearest.sort(-1).values.numpy(), expected.sort(-1).values.numpy())
    # Probing ranks lists by x·c plus a per-list bias (the weighted radius).
    radii = torch.rand(40, generator=gen)
    probed = ivf_search._top_centroids(points, centroids, radii, count)
    bound = points.double() @ centroids.double().T + radii.double()
    expected = bound.topk(count).indices
    np.testing.assert_array_equal(probed.sort(-1).values.numpy(), expected.sort(-1).values.numpy())


def test_ivf_lists_are_numbered_by_their_largest_score_and_radii_cover_their_keys():
    gen = torch.Generator().manual_seed(4)
    _, lifted_key = ivf_common.lift(torch.randn(3000, 6, generator=gen), torch.randn(3000, 6, generator=gen))
    centroids, radii, key_list = ivf_search._inverted_lists(lifted_key, 24, torch.Generator().manual_seed(0))
    distance = (lifted_key - centroids[key_list]).norm(dim=-1)
    for j in range(24):
        members = distance[key_list == j]
        assert radii[j] == ivf_search._RADIUS_WEIGHT * (members.max() if members.numel() else 0.0)
    assert torch.equal(key_list, ivf_search._nearest_centroids(lifted_key, centroids, 1)[:, 0])
    potential = centroids.norm(dim=-1) + radii
    assert torch.all(potential[:-1] >= potential[1:])


def test_ivf_recall_grows_with_nprobe_and_scores_are_exact(ragged, monkeypatch):
    monkeypatch.setattr(ivf_common, "IVF_MIN_NODES", 100)
    query, key, ptr = ragged([1000], heads=1, dim=8)
    _, ref_index = reference_topk(query, key, 10, ptr.tolist())
    recalls = []
    for nprobe in (2, 8, 32):
        scores, index = topk_inner_product(query, key, 10, ptr=ptr, backend="ivf", nlist=32, nprobe=nprobe)
        recalls.append(float(_recall(index.numpy(), ref_index)))
        found = index >= 0
        true_scores = (query[:, :, None] * key[index.clamp_min(0), 0]).sum(-1)
        torch.testing.assert_close(scores[found], true_scores[found], rtol=1e-5, atol=1e-5)
    assert 0.2 < recalls[0] < recalls[1] < recalls[2] == 1.0


def test_kmip_attention_with_ivf_probing_everything_equals_reference(ragged, monkeypatch):
    monkeypatch.setattr(ivf_common, "IVF_MIN_NODES", 100)
    query, key, ptr = ragged([300, 40], heads=1, dim=4)
    value = torch.randn(340, 1, 3)
    out = kmip_attention(query, key, value, 8, ptr=ptr, backend="ivf", nlist=8, nprobe=8)
    expected = reference_attention(query, key, value, 8, ptr.tolist())
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.requires("faiss")
def test_faiss_probing_every_list_finds_the_exact_top_k(ragged, monkeypatch):
    monkeypatch.setattr(ivf_common, "IVF_MIN_NODES", 100)
    query, key, ptr = ragged([400, 20], heads=2, dim=8)
    scores, index = topk_inner_product(query, key, 10, ptr=ptr, backend="faiss", nlist=16, nprobe=16)
    _assert_selects_reference_scores(query, key, ptr, 10, scores, index)


def test_faiss_backend_reports_missing_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "faiss", None)
    with pytest.raises(ImportError, match=r"kmipgt\[faiss\]"):
        topk_inner_product(torch.randn(5, 1, 3), torch.randn(5, 1, 3), 2, backend="faiss")


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"backend": "ivf", "nlist": 0}, ValueError, "`nlist` must be >= 1"),
        ({"backend": "ivf", "nprobe": 2.5}, TypeError, "`nprobe` must be an int"),
        ({"backend": "faiss", "nlist": -3}, ValueError, "`nlist` must be >= 1"),
        ({"backend": "torch", "nprobe": 4}, ValueError, "only apply to backends"),
        ({"backend": "fused", "nlist": 4}, ValueError, "only apply to backends"),
    ],
)
def test_bad_search_options_name_the_argument(kwargs, error, match):
    if kwargs["backend"] == "faiss":
        pytest.importorskip("faiss")
    with pytest.raises(error, match=match):
        topk_inner_product(torch.randn(5, 1, 3), torch.randn(5, 1, 3), 2, **kwargs)


def test_triton_backend_on_cpu_tensors_is_refused(monkeypatch):
    import kmipgt.ops.search.backends.triton_search as triton_search

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    query = torch.randn(5, 1, 3)
    if triton_search.triton_available():
        with pytest.raises(ValueError, match="runs on CUDA"):
            topk_inner_product(query, query, 2, backend="triton")
    monkeypatch.setattr(triton_search, "triton_available", lambda: False)
    with pytest.raises(ImportError, match="needs the `triton` package"):
        topk_inner_product(query, query, 2, backend="triton")


_TRITON_SCRIPT = """
import numpy as np, torch
from kmipgt.ops import topk_inner_product
from kmipgt.ops.search.cuda_device import SM90_SHARED_MEMORY
from kmipgt.ops.search.triton_plan import search_plan
from reference import reference_topk
from ties_at_zero import ties_at_zero
gen = torch.Generator().manual_seed(0)

def check(query, key, k, ptr):
    scores, index = topk_inner_product(query, key, k, ptr=ptr, backend="triton")
    ref_scores, ref_index = reference_topk(query, key, k, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)
    np.testing.assert_array_equal(scores.float().numpy(), ref_scores)

def draw(rows, dim):
    return [torch.randint(-2, 3, (rows, 1, dim), generator=gen).float() for _ in range(2)]

ptr = torch.tensor([0, 70, 70, 73, 100])
check(*draw(100, 5), 5, ptr)
# k past the largest graph (and past the kernel's 128 slots) only pads.
check(*draw(23, 5), 150, torch.tensor([0, 20, 20, 23]))
# d = 160 runs the plan sm_90 has room for: 32 x 32 tiles, not 64 x 64.
assert search_plan(160, 6, SM90_SHARED_MEMORY).block_m == 32
check(*draw(45, 160), 6, torch.tensor([0, 40, 45]))
for dtype in (torch.float32, torch.float16):
    query, key, _, zero_ptr = ties_at_zero(dtype)
    check(query, key, 12, zero_ptr)
print("TRITON-OK")
"""


@pytest.mark.slow
@pytest.mark.skipif(
    torch.cuda.is_available(), reason="with a GPU the compiled kernel is tested by ops/test_cuda_search.py"
)
@pytest.mark.requires("triton")
def test_triton_kernel_logic_in_the_interpreter():
    # The kmipgt this test imported (src/, or an installed wheel's), and the tests' helpers.
    package_parent, tests = Path(kmipgt.__file__).resolve().parents[1], Path(__file__).resolve().parents[1]
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(package_parent), str(tests)])}
    done = subprocess.run(
        [sys.executable, "-c", _TRITON_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert "TRITON-OK" in done.stdout, done.stderr[-3000:]
