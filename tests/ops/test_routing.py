"""Routing by the whole call (device, dtype, k, head dim, largest graph), decided on the host.

Every combination is routed on the CPU as it would be on a CUDA device with sm_90's shared memory, and
the backend it gets is checked against what that backend's kernel can serve: its dtypes, its k limit and
its launch plan's shared memory (the formulas tests/ops/test_triton_plans.py holds against the compiler).
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch

import kmipgt.ops.search.backends.faiss_search as faiss_search
import kmipgt.ops.search.backends.ivf_search as ivf_search
import kmipgt.ops.search.ivf_common as ivf_common
from kmipgt.ops import topk_inner_product
from kmipgt.ops.search import registry
from kmipgt.ops.search.backends.triton_search import MAX_TRITON_K, triton_available
from kmipgt.ops.search.cuda_device import SM90_SHARED_MEMORY
from kmipgt.ops.search.triton_plan import search_plan
from kmipgt.ops.small_graphs import cuda_plan
from kmipgt.ops.triton_attention_plan import MAX_FUSED_K, MAX_FUSED_NODES
from reference import reference_topk

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
HALF_AND_FLOAT = DTYPES[:3]
HEAD_DIMS = (1, 2, 16, 19, 32, 64, 100, 128, 129, 160, 192, 256)
GRAPH_SIZES = (1, 5, 64, 100, 128, 129, 199, 256, 257, 1000, 4096)


def _calls():
    """Every (device, dtype, head dim, largest graph, k up to and past it, key layout) call."""
    for device, dtype, head_dim, size, queries_differ in itertools.product(
        ("cpu", "cuda"), DTYPES, HEAD_DIMS, GRAPH_SIZES, (False, True)
    ):
        for k in sorted({1, 5, 64, 65, 128, 129, 300, size // 2 or 1, size, size + 1}):
            yield registry.SearchCall(device, dtype, k, head_dim, size, queries_differ, SM90_SHARED_MEMORY)


def _serves(name: str, call: registry.SearchCall) -> bool:
    """What each exact backend's kernel serves, stated apart from the registry's flags."""
    if name == "torch":
        return True
    if name == "fused":
        return call.device_type == "cpu" and call.dtype != torch.float64
    if name == "triton":
        plan = search_plan(call.head_dim, call.slots, call.shared_memory)
        return (
            call.device_type == "cuda" and call.dtype in HALF_AND_FLOAT and call.slots <= MAX_TRITON_K
            and not call.queries_differ and plan is not None and plan.shared_memory <= call.shared_memory
            and plan.block_d >= call.head_dim and plan.k_pad >= call.slots
        )
    raise AssertionError(f"auto routed to {name!r}, which has no stated limits here")


def test_no_backend_is_routed_a_call_it_cannot_serve_and_every_call_has_a_route():
    routed = {}
    for call in _calls():
        backend = registry.route(call)
        assert _serves(backend.name, call), (backend.name, call)
        routed[backend.name] = routed.get(backend.name, 0) + 1
    assert routed["torch"] > 0
    if triton_available():
        assert routed["triton"] > 0


@pytest.mark.skipif(not triton_available(), reason="needs triton")
@pytest.mark.parametrize("dtype", HALF_AND_FLOAT, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_cuda_keeps_the_triton_search_for_every_head_dim_up_to_256(dtype, head_dim):
    for size, k in itertools.product(GRAPH_SIZES, (1, 16, 128, 129, 5000)):
        call = registry.SearchCall("cuda", dtype, k, head_dim, size, False, SM90_SHARED_MEMORY)
        expected = "triton" if min(k, size) <= MAX_TRITON_K else "torch"
        assert registry.route(call).name == expected, call


def test_the_fused_cuda_kernels_take_only_calls_their_plan_serves():
    """The small-graph decision on CUDA: a plan within the kernels' limits and sm_90's shared memory, or
    None (the search path, which always has a route); never a plan that would not launch."""
    taken = 0
    for call in _calls():
        if call.device_type != "cuda" or call.queries_differ or call.k > call.max_nodes:
            continue  # kmip_attention clamps k to the largest graph and fuses queries that are the keys
        for value_dim in (call.head_dim, 16):
            plan = cuda_plan(call, value_dim)
            if plan is None:
                continue
            taken += 1
            assert call.dtype in HALF_AND_FLOAT
            assert call.k <= MAX_FUSED_K and call.max_nodes <= MAX_FUSED_NODES
            assert plan.block_d >= call.head_dim and plan.block_dv >= value_dim and plan.k_pad >= call.k
            assert max(plan.forward_shared_memory, plan.backward_shared_memory) <= SM90_SHARED_MEMORY
    assert taken > 0 or not triton_available()


def _spy_route(monkeypatch, module) -> list:
    """Record the calls ``module`` routes, routing them as it would."""
    calls = []

    def recording(call):
        calls.append(call)
        return registry.route(call)

    monkeypatch.setattr(module, "route", recording)
    return calls


@pytest.mark.parametrize("k", [4, 150])
def test_ivf_routes_its_small_graphs_by_k_head_dim_and_their_largest(k, monkeypatch):
    """The small graphs' exact search is routed with the caller's k and head dim and the largest small
    graph, so on CUDA k > 128 over graphs of more than 128 nodes never reaches the Triton kernel."""
    calls = _spy_route(monkeypatch, ivf_search)
    gen = torch.Generator().manual_seed(0)
    sizes = [200, 30, 1100]
    ptr = torch.tensor([0, *np.cumsum(sizes)])
    query, key = (torch.randint(-2, 3, (sum(sizes), 2, 160), generator=gen).float() for _ in range(2))
    scores, index = topk_inner_product(query, key, k, ptr=ptr, backend="ivf", nlist=4, nprobe=4)
    (call,) = calls
    assert (call.k, call.head_dim, call.max_nodes, call.dtype) == (k, 160, 200, torch.float32)
    on_cuda = registry.route(replace(call, device_type="cuda"))
    assert on_cuda.name == ("triton" if k <= MAX_TRITON_K and triton_available() else "torch")
    ref_scores, ref_index = reference_topk(query, key, k, ptr.tolist())
    small = slice(0, 230)  # the graphs under IVF_MIN_NODES, searched exactly
    np.testing.assert_array_equal(index[small].numpy(), ref_index[small])
    np.testing.assert_array_equal(scores[small].numpy(), ref_scores[small])


@pytest.mark.requires("faiss")
def test_faiss_routes_its_small_graphs_by_the_whole_call(monkeypatch):
    calls = _spy_route(monkeypatch, faiss_search)
    query = torch.randn(40, 1, 24, generator=torch.Generator().manual_seed(1))
    topk_inner_product(query, query, 150, backend="faiss")
    (call,) = calls
    assert (call.k, call.head_dim, call.max_nodes) == (150, 24, 40)


@pytest.mark.parametrize("backend", ["ivf", pytest.param("faiss", marks=pytest.mark.requires("faiss"))])
def test_the_calibration_sample_is_routed_by_k_head_dim_and_its_keys(backend, monkeypatch):
    """Calibrating nprobe (the default) searches a sample of an index's queries exactly among all its keys:
    routed with the caller's k and head dim, the index's key count, and keys laid out apart from the
    sampled queries, so on CUDA it never reaches the Triton kernel, which searches queries that are keys."""
    calls = _spy_route(monkeypatch, ivf_common)
    gen = torch.Generator().manual_seed(2)
    query, key = (torch.randn(1100, 1, 160, generator=gen) for _ in range(2))
    topk_inner_product(query, key, 150, backend=backend, nlist=8)
    (call,) = calls
    assert (call.k, call.head_dim, call.max_nodes, call.dtype) == (150, 160, 1100, torch.float32)
    assert call.queries_differ
    assert registry.route(replace(call, device_type="cuda")).name == "torch"
