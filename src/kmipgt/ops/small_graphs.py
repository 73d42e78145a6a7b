"""Which fused small-graph k-MIP kernel serves a call: search, softmax and weighted sum in one kernel.

On a batch of small graphs (molecules, peptides) the search-then-gather path of
:func:`~kmipgt.ops.kmip_attention` spends most of its time outside the arithmetic: on the CPU in
``[N, H, k, d]`` gathers and scatters, on CUDA in launches and host round trips. The fused kernels
(:func:`kmipgt.ops.fused_attention.fused_kmip_attention` on the CPU,
:func:`kmipgt.ops.triton_attention.triton_kmip_attention` on CUDA) do a graph's scores, selection,
softmax and sum in one pass and keep only the ``[N, H, k]`` selection for the backward. They compute
the same exact top-k as the search backends (ties to the lower index) and are chosen on host facts
alone: the device, dtype, k, head dims, the batch's largest graph (on CUDA: whether the kernels' launch
plan fits the device's shared memory, :mod:`~kmipgt.ops.triton_attention_plan`) and graph count against
the CPU threads, and no attention dropout. Within a graph that holds a NaN or inf the result is
unspecified (the CPU kernel never selects a NaN score, the Triton kernel ranks it first), as with
``check_finite=False`` anywhere.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from kmipgt.ops.ragged import RaggedLayout
from kmipgt.ops.search.backends.triton_search import triton_available
from kmipgt.ops.search.cuda_device import shared_memory_limit
from kmipgt.ops.search.registry import SearchCall
from kmipgt.ops.triton_attention_plan import AttentionPlan, attention_plan

__all__ = ["CPU_MAX_NODES", "cuda_plan", "fused_kernel", "fused_kernel_serves"]

# The fused CPU kernel is one task per (graph, head): on one thread it beats the search plus the
# gathers up to 16,384 nodes (docs/benchmarks.md), but a batch of few large graphs leaves threads idle
# that the search's query blocks would use. Up to this size it is taken wherever every thread has a task.
CPU_MAX_NODES = 4096


class _CPUKernel(NamedTuple):
    """The C++ kernels for ``k`` slots over the graphs of host offsets ``ptr``."""

    k: int
    ptr: Tensor

    def forward(self, query: Tensor, key: Tensor, value: Tensor, scale: float):
        from kmipgt.ops.fused_attention import fused_forward

        return fused_forward(query, key, value, self.k, self.ptr, scale)

    def backward(self, query, key, value, grad_out, index, weight, scale: float):
        from kmipgt.ops.fused_attention import fused_backward

        return fused_backward(query, key, value, grad_out, index, weight, self.ptr, scale)


class _CUDAKernel(NamedTuple):
    """The Triton kernels for ``k`` slots over the graphs of the device offsets ``ptr``, at most
    ``max_nodes`` nodes each, launched by ``plan``."""

    k: int
    ptr: Tensor
    max_nodes: int
    plan: AttentionPlan

    def forward(self, query: Tensor, key: Tensor, value: Tensor, scale: float):
        from kmipgt.ops.triton_attention import triton_forward

        return triton_forward(query, key, value, self.ptr, self.k, self.max_nodes, scale, self.plan)

    def backward(self, query, key, value, grad_out, index, weight, scale: float):
        from kmipgt.ops.triton_attention import triton_backward

        return triton_backward(query, key, value, grad_out, self.ptr, index, weight, self.max_nodes, scale,
                               self.plan)


def _cpu_kernel(query: Tensor, k: int, layout: RaggedLayout) -> _CPUKernel | None:
    from kmipgt.ops.fused_attention import fused_attention_available

    too_few_tasks = layout.num_graphs * query.shape[1] < torch.get_num_threads()
    if layout.max_nodes > CPU_MAX_NODES or too_few_tasks or query.dtype == torch.float64:
        return None
    if not fused_attention_available():
        return None
    return _CPUKernel(k, layout.ptr)


def cuda_plan(call: SearchCall, value_dim: int) -> AttentionPlan | None:
    """The launch plan of the fused Triton kernels for a CUDA ``call`` with values of ``value_dim``, or None
    where they cannot serve it (dtype, largest graph, k, shared memory at these head dims, no Triton)."""
    if not triton_available():
        return None
    return attention_plan(
        call.dtype, call.head_dim, value_dim, call.max_nodes, call.slots, call.shared_memory
    )


def _cuda_kernel(query: Tensor, value_dim: int, k: int, layout: RaggedLayout) -> _CUDAKernel | None:
    call = SearchCall(
        device_type="cuda", dtype=query.dtype, k=k, head_dim=query.shape[-1], max_nodes=layout.max_nodes,
        queries_differ=False, shared_memory=shared_memory_limit(query.device),
    )
    plan = cuda_plan(call, value_dim)
    if plan is None:
        return None
    return _CUDAKernel(k, layout.device_ptr, layout.max_nodes, plan)


def fused_kernel(
    query: Tensor, value_dim: int, k: int, layout: RaggedLayout
) -> _CPUKernel | _CUDAKernel | None:
    """The fused kernels that serve ``[N, H, d]`` queries with values of ``value_dim`` and ``k`` slots (at
    most the largest graph) over ``layout``'s graphs, or None; decided on host facts alone. Each has
    ``forward(query, key, value, scale) -> (out, index, score, weight)`` and
    ``backward(query, key, value, grad_out, index, weight, scale) -> (grad_query, grad_key, grad_value)``,
    without autograd, on inputs of the queries' dtype."""
    if layout.num_nodes == 0:
        return None
    if query.device.type == "cpu":
        return _cpu_kernel(query, k, layout)
    if query.device.type == "cuda":
        return _cuda_kernel(query, value_dim, k, layout)
    return None


def fused_kernel_serves(query: Tensor, value: Tensor, k: int, layout: RaggedLayout) -> bool:
    """Whether a fused kernel serves these ``[N, H, d]`` queries, ``[N, H, d_v]`` values, ``k`` (at most the
    largest graph) and layout (:func:`fused_kernel`)."""
    return fused_kernel(query, value.shape[-1], k, layout) is not None
