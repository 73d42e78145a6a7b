"""Launch plans of the Triton kernels: the host's choice for every head dim, and the shared-memory formula
against what Triton's own compiler allocates for sm_90 (compiled here, on the CPU, without a GPU)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kmipgt.ops.search.cuda_device import SM90_SHARED_MEMORY
from kmipgt.ops.search.triton_plan import SearchPlan, search_plan
from kmipgt.ops.triton_attention_plan import (
    MAX_FUSED_K,
    MAX_FUSED_NODES,
    AttentionPlan,
    attention_plan,
    k_bucket,
)

# A100's opt-in limit: a device with less shared memory than sm_90 gets smaller plans, not failures.
SM80_SHARED_MEMORY = 166_912
HEAD_DIMS = (1, 2, 16, 19, 32, 33, 64, 100, 128, 129, 160, 192, 255, 256)
HALF_AND_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("limit", [SM90_SHARED_MEMORY, SM80_SHARED_MEMORY])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("k", [1, 5, 16, 64, 128])
def test_the_search_plan_covers_the_head_dim_and_k_within_the_limit(head_dim, k, limit):
    plan = search_plan(head_dim, k, limit)
    assert plan is not None
    assert plan.block_d >= head_dim and plan.k_pad >= k
    assert plan.shared_memory <= limit
    # The largest plan that fits is taken: three stages of 64 x 64 tiles wherever they fit.
    full = SearchPlan(64, 64, plan.block_d, plan.k_pad, 3)
    assert (plan == full) == (full.shared_memory <= limit)


def test_the_search_plan_shrinks_where_the_review_found_too_much_shared_memory():
    # Three stages at d = 256 needed 384 KiB; on sm_90 the plan keeps a third of that.
    assert SearchPlan(64, 64, 256, 16, 3).shared_memory == 393_216
    assert search_plan(256, 16, SM90_SHARED_MEMORY) == SearchPlan(32, 32, 256, 16, 3)
    assert search_plan(128, 16, SM90_SHARED_MEMORY) == SearchPlan(64, 64, 128, 16, 3)
    assert search_plan(128, 16, SM80_SHARED_MEMORY) == SearchPlan(64, 64, 128, 16, 2)
    assert search_plan(512, 16, SM90_SHARED_MEMORY) is None


@pytest.mark.parametrize("dtype", HALF_AND_FLOAT, ids=str)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("max_nodes", [1, 16, 64, 65, 128, 129, 200, 256])
def test_the_attention_plan_fits_or_refuses(dtype, head_dim, max_nodes):
    k = min(MAX_FUSED_K, max_nodes)
    plan = attention_plan(dtype, head_dim, head_dim, max_nodes, k, SM90_SHARED_MEMORY)
    # Only float32 at head dims over 128 with graphs over 128 nodes needs more than sm_90 has: the
    # review's 256 KiB for a [256, 256] float32 key block.
    refused = dtype == torch.float32 and head_dim > 128 and max_nodes > 128
    assert (plan is None) == refused
    if plan is not None:
        assert plan.block_d >= head_dim and plan.block_n >= max_nodes and plan.k_pad >= k
        assert max(plan.forward_shared_memory, plan.backward_shared_memory) <= SM90_SHARED_MEMORY


def test_the_attention_plan_refuses_what_the_kernels_never_take():
    assert attention_plan(torch.float64, 16, 16, 10, 4, SM90_SHARED_MEMORY) is None
    assert attention_plan(torch.float32, 16, 16, MAX_FUSED_NODES + 1, 4, SM90_SHARED_MEMORY) is None
    assert attention_plan(torch.float32, 16, 16, 200, MAX_FUSED_K + 1, SM90_SHARED_MEMORY) is None
    assert attention_plan(torch.float32, 256, 256, 256, 4, SM90_SHARED_MEMORY + 10**6) is not None


def test_k_compiles_once_per_power_of_two_bucket():
    """k clamped to each batch's largest graph takes every value 1..64; the kernels see 7 buckets."""
    buckets = {k: k_bucket(k) for k in range(1, MAX_FUSED_K + 1)}
    assert set(buckets.values()) == {1, 2, 4, 8, 16, 32, 64}
    assert all(k <= bucket < 2 * k for k, bucket in buckets.items())
    # A stream of batches of graphs of 1..256 nodes with k = 64: the compile-time constants of the
    # launches (everything in the plan: k itself is a runtime argument) take few distinct values.
    plans = {
        attention_plan(torch.float32, 19, 19, nodes, min(64, nodes), SM90_SHARED_MEMORY)
        for nodes in range(1, MAX_FUSED_NODES + 1)
    }
    assert len(plans) <= 5 * 7
    assert len(plans) == len({(p.block_n, p.k_pad) for p in plans})


# --- The formulas against Triton's compiler for sm_90 (slow: each compile takes seconds) ---------------


def _compile_shared(kernel, pointer_types: dict[str, str], constants: dict[str, int], **options) -> int:
    """Bytes of shared memory Triton allocates for ``kernel`` compiled for sm_90 with these constants;
    ``pointer_types`` may name pointers the kernel lacks; other arguments are int32 (``scale`` a float)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    signature = {name: pointer_types.get(name, "i32") for name in kernel.arg_names}
    signature.update({name: "constexpr" for name in constants})
    if "scale" in signature:
        signature["scale"] = "fp32"
    source = ASTSource(kernel, signature, constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    return compiled.metadata.shared


def _has_nvidia_backend() -> bool:
    return importlib.util.find_spec("triton") is not None and importlib.util.find_spec(
        "triton.backends.nvidia"
    ) is not None


needs_compiler = pytest.mark.skipif(not _has_nvidia_backend(), reason="needs triton's NVIDIA backend")


@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize(
    "plan",
    [search_plan(16, 128, SM90_SHARED_MEMORY), search_plan(128, 16, SM90_SHARED_MEMORY),
     search_plan(256, 16, SM90_SHARED_MEMORY)],
    ids=["d16-k128", "d128", "d256"],
)
def test_the_search_formula_bounds_the_compiled_kernel(plan):
    from kmipgt.ops.search.triton_kernel import _topk_kernel

    pointers = {"query": "*fp32", "key": "*fp32", "out_scores": "*fp32", "out_index": "*i64"}
    pointers.update({name: "*i64" for name in ("block_query_start", "block_query_end", "block_key_start",
                                                  "block_key_end")})
    constants = {"BLOCK_M": plan.block_m, "BLOCK_N": plan.block_n, "BLOCK_D": plan.block_d,
                 "K_PAD": plan.k_pad}
    shared = _compile_shared(_topk_kernel, pointers, constants, num_warps=4, num_stages=plan.stages)
    assert shared <= plan.shared_memory <= SM90_SHARED_MEMORY


def _attention_pointers(dtype: str, names: tuple[str, ...]) -> dict[str, str]:
    pointers = {name: f"*{dtype}" for name in names}
    pointers.update({"ptr": "*i64", "index": "*i64", "out_index": "*i64", "weight": "*fp32",
                     "out_weight": "*fp32", "out_score": "*fp32"})
    return pointers


ATTENTION_CASES = {
    # dtype, head dim, value dim, largest graph: each the tightest of its kind of program.
    "fp32-wgmma": (torch.float32, 64, 64, 64),
    "fp32-mma-d256": (torch.float32, 256, 256, 128),
    "bf16-mma-d256": (torch.bfloat16, 256, 256, 256),
    "bf16-wgmma": (torch.bfloat16, 160, 16, 16),
}


@pytest.mark.slow
@needs_compiler
@pytest.mark.parametrize("case", ATTENTION_CASES.values(), ids=ATTENTION_CASES.keys())
def test_the_attention_formulas_bound_the_compiled_kernels(case):
    from kmipgt.ops.triton_attention import _backward_kernel, _forward_kernel

    dtype, head_dim, value_dim, max_nodes = case
    plan: AttentionPlan = attention_plan(dtype, head_dim, value_dim, max_nodes, 5, SM90_SHARED_MEMORY)
    name = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
    blocks = {"BLOCK_D": plan.block_d, "BLOCK_DV": plan.block_dv, "K_PAD": plan.k_pad}
    forward = _compile_shared(
        _forward_kernel, _attention_pointers(name, ("query", "key", "value", "out")),
        {**blocks, "BLOCK_M": plan.block_m, "BLOCK_N": plan.block_n}, num_warps=plan.warps,
    )
    tensors = ("query", "key", "value", "grad_out", "grad_query", "grad_key", "grad_value")
    backward = _compile_shared(
        _backward_kernel, _attention_pointers(name, tensors),
        {**blocks, "BLOCK_M": plan.query_tile, "BLOCK_N": plan.key_chunk}, num_warps=4,
    )
    assert forward <= plan.forward_shared_memory <= SM90_SHARED_MEMORY
    assert backward <= plan.backward_shared_memory <= SM90_SHARED_MEMORY
