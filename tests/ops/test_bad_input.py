"""One contract for bad input on every search backend: head dimension 0, NaN/inf, half precision.

See docs/reliability.md. Backends whose extra or device is absent here skip.
"""

import numpy as np
import pytest
import torch

from kmipgt.ops import (
    APPROXIMATE_BACKENDS,
    full_attention,
    full_attention_topk,
    kmip_attention,
    topk_inner_product,
)
from reference import reference_attention, reference_topk

BACKENDS = [
    "auto",
    "torch",
    "dense",
    "fused",
    "ivf",
    pytest.param("faiss", marks=pytest.mark.requires("faiss")),
    pytest.param("keops", marks=pytest.mark.requires("pykeops")),
    pytest.param("triton", marks=pytest.mark.cuda),
]


def _device(backend):
    return "cuda" if backend == "triton" else "cpu"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(10, 2, 0), (10, 0, 4), (0, 2, 0)])
def test_empty_head_or_head_dimension_is_a_value_error_on_every_backend(backend, shape):
    query = torch.randn(shape, device=_device(backend))
    with pytest.raises(ValueError, match=r"H >= 1 heads and head dimension d >= 1"):
        topk_inner_product(query, query.clone(), 3, backend=backend)
    with pytest.raises(ValueError, match=r"head dimension d >= 1"):
        kmip_attention(query, query, query, 3, backend=backend)


def test_empty_head_dimension_is_a_value_error_in_full_attention():
    query = torch.randn(10, 2, 0)
    with pytest.raises(ValueError, match=r"head dimension d >= 1"):
        full_attention(query, query, torch.randn(10, 2, 3))
    with pytest.raises(ValueError, match=r"head dimension d >= 1"):
        full_attention_topk(query, query, 2)


def test_head_dimension_one_matches_reference(ragged):
    query, key, value, ptr = ragged([30, 9], dim=1, dtype=torch.float64, count=3)
    _, index = topk_inner_product(query.float(), key.float(), 4, ptr=ptr)
    _, ref_index = reference_topk(query, key, 4, ptr.tolist())
    np.testing.assert_array_equal(index.numpy(), ref_index)
    out = kmip_attention(query, key, value, 4, ptr=ptr)
    torch.testing.assert_close(out, reference_attention(query, key, value, 4, ptr.tolist()))


def _poison(tensor, row, value):
    tensor = tensor.clone()
    tensor[row, 1, 2] = value
    return tensor


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("name", ["query", "key"])
def test_non_finite_search_input_names_tensor_and_first_row(ragged, backend, bad, name):
    # 1,100 nodes: the IVF backends index a graph this large instead of searching it exactly.
    query, key, _, ptr = ragged([1100, 40], dim=4, count=3)
    inputs = {"query": query, "key": key}
    inputs[name] = _poison(_poison(inputs[name], 1105, bad), 1120, bad)
    device = _device(backend)
    with pytest.raises(ValueError, match=rf"`{name}` holds NaN or inf \(first in row 1105 of 1140\)"):
        topk_inner_product(inputs["query"].to(device), inputs["key"].to(device), 5, ptr=ptr, backend=backend)


@pytest.mark.parametrize("function", ["kmip", "full", "full_topk"])
@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_non_finite_attention_input_names_tensor_and_first_row(ragged, function, name):
    query, key, value, ptr = ragged([7, 20], count=3)
    inputs = {"query": query, "key": key, "value": value}
    inputs[name] = _poison(inputs[name], 12, float("nan"))
    match = rf"`{name}` holds NaN or inf \(first in row 12 of 27\)"
    if function == "full_topk":
        if name == "value":
            pytest.skip("full_attention_topk takes no value")
        with pytest.raises(ValueError, match=match):
            full_attention_topk(inputs["query"], inputs["key"], 3, ptr=ptr)
        return
    with pytest.raises(ValueError, match=match):
        if function == "kmip":
            kmip_attention(*inputs.values(), 3, ptr=ptr)
        else:
            full_attention(*inputs.values(), ptr=ptr)


def _per_graph_sdpa(query, key, value, ptr):
    rows = []
    for start, end in zip(ptr[:-1].tolist(), ptr[1:].tolist()):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        weights = torch.softmax(q @ k.transpose(1, 2) / query.shape[-1] ** 0.5, dim=-1)
        rows.append((weights @ v).transpose(0, 1))
    return torch.cat(rows)


@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_unchecked_nan_in_one_graph_never_reaches_another(ragged, name):
    query, key, value, ptr = ragged([9, 0, 14, 5], dtype=torch.float64, count=3)
    inputs = {"query": query, "key": key, "value": value}
    inputs[name] = _poison(inputs[name], 3, float("nan"))
    clean = slice(9, 28)
    out = full_attention(*inputs.values(), ptr=ptr, check_finite=False)
    torch.testing.assert_close(out[clean], _per_graph_sdpa(query, key, value, ptr)[clean])
    kmip = kmip_attention(*inputs.values(), 4, ptr=ptr, backend="torch", check_finite=False)
    ref = reference_attention(query, key, value, 4, ptr.tolist())
    torch.testing.assert_close(kmip[clean], ref[clean])


def test_finite_check_can_be_skipped_for_finite_inputs(ragged):
    query, key, value, ptr = ragged([30, 12], dtype=torch.float64, count=3)
    checked = kmip_attention(query, key, value, 5, ptr=ptr)
    torch.testing.assert_close(kmip_attention(query, key, value, 5, ptr=ptr, check_finite=False), checked)


HALF_BACKENDS = [b for b in BACKENDS if getattr(b, "values", (b,))[0] not in ("keops",)]


@pytest.mark.parametrize("backend", HALF_BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_ranks_like_float32_even_beyond_the_half_range(ragged, backend, dtype):
    # Scores reach about 4·10⁵, beyond float16's 65,504: a float16 product would tie them all at inf.
    query, key, _, ptr = ragged([1100, 30], heads=1, dim=64, dtype=dtype, scale=80.0, count=3)
    device = _device(backend)
    # The approximate backends build an index (1,100 keys) and probe every list of it: exact.
    probe_all = {"nlist": 16, "nprobe": 16} if backend in APPROXIMATE_BACKENDS else {}
    scores, index = topk_inner_product(
        query.to(device), key.to(device), 5, ptr=ptr, backend=backend, **probe_all
    )
    ref_scores, ref_index = reference_topk(query.double(), key.double(), 5, ptr.tolist())
    np.testing.assert_array_equal(index.cpu().numpy(), ref_index)
    assert scores.dtype == dtype
    torch.testing.assert_close(scores.cpu(), torch.from_numpy(ref_scores).to(dtype), rtol=1e-2, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("function", ["kmip", "full"])
def test_half_precision_attention_matches_float32_reference(ragged, dtype, function):
    query, key, value, ptr = ragged([40, 9], dim=64, dtype=dtype, scale=80.0, count=3)
    if function == "kmip":
        out = kmip_attention(query, key, value, 6, ptr=ptr)
        ref = reference_attention(query.double(), key.double(), value.double(), 6, ptr.tolist())
    else:
        out = full_attention(query, key, value, ptr=ptr)
        ref = _per_graph_sdpa(query.double(), key.double(), value.double(), ptr)
    assert out.dtype == dtype and bool(out.isfinite().all())
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=0.5)


def test_half_precision_full_attention_topk_weights_match_float32(ragged):
    query, key, _, ptr = ragged([40, 9], dim=64, dtype=torch.float16, scale=40.0, count=3)
    half = full_attention_topk(query, key, 4, ptr=ptr)
    single = full_attention_topk(query.float(), key.float(), 4, ptr=ptr)
    torch.testing.assert_close(half.index, single.index)
    torch.testing.assert_close(half.weight, single.weight, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(half.mass, single.mass, rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name", ["query", "key", "value"])
def test_unchecked_nan_never_leaks_through_padding_slots(ragged, name):
    # Found by ops/test_properties.py: the padding slots of a graph smaller than k gathered row 0 with
    # weight 0, and 0·NaN put graph 0's NaN into every small graph.
    query, key, value, ptr = ragged([6, 2, 1], dtype=torch.float64, count=3)
    inputs = {"query": query, "key": key, "value": value}
    inputs[name] = _poison(inputs[name], 0, float("nan"))
    out = kmip_attention(*inputs.values(), 4, ptr=ptr, backend="torch", check_finite=False)
    ref = reference_attention(query, key, value, 4, ptr.tolist())
    torch.testing.assert_close(out[6:], ref[6:])


@pytest.mark.parametrize("name", ["query", "key"])
def test_unchecked_nan_in_an_ivf_index_stays_in_its_graph(ragged, name):
    # Found by ops/test_properties.py: a NaN query selects no inverted list (-1), and the probe grouping
    # wrote out of bounds: the process aborted.
    query, key, _, ptr = ragged([1100, 40], dim=4, count=3)
    inputs = {"query": query, "key": key}
    inputs[name] = _poison(inputs[name], 3, float("nan"))
    _, index = topk_inner_product(*inputs.values(), 5, ptr=ptr, backend="ivf", check_finite=False)
    _, ref_index = reference_topk(query, key, 5, ptr.tolist())
    np.testing.assert_array_equal(index[1100:].numpy(), ref_index[1100:])
