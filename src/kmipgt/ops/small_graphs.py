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

import torch
from torch import Tensor

from kmipgt.ops.ragged import RaggedLayout
from kmipgt.ops.search.backends.triton_search import triton_available
from kmipgt.ops.search.cuda_device import shared_memory_limit
from kmipgt.ops.search.registry import SearchCall
from kmipgt.ops.triton_attention_plan import AttentionPlan, attention_plan

__all__ = ["CPU_MAX_NODES", "cuda_plan", "fused_kernel_serves", "fused_small_graph_attention"]

# The fused CPU kernel is one task per (graph, head): on one thread it beats the search plus the
# gathers up to 16,384 nodes (docs/benchmarks.md), but a batch of few large graphs leaves threads idle
# that the search's query blocks would use. Up to this size it is taken wherever every thread has a task.
CPU_MAX_NODES = 4096


def _cpu_kernel(query: Tensor, k: int, layout: RaggedLayout):
    from kmipgt.ops.fused_attention import fused_attention_available, fused_kmip_attention

    too_few_tasks = layout.num_graphs * query.shape[1] < torch.get_num_threads()
    if layout.max_nodes > CPU_MAX_NODES or too_few_tasks or query.dtype == torch.float64:
        return None
    if not fused_attention_available():
        return None
    return lambda q, key, v, scale: fused_kmip_attention(q, key, v, k, layout.ptr, scale)


def cuda_plan(call: SearchCall, value_dim: int) -> AttentionPlan | None:
    """The launch plan of the fused Triton kernels for a CUDA ``call`` with values of ``value_dim``, or None
    where they cannot serve it (dtype, largest graph, k, shared memory at these head dims, no Triton)."""
    if not triton_available():
        return None
    return attention_plan(
        call.dtype, call.head_dim, value_dim, call.max_nodes, call.slots, call.shared_memory
    )


def _cuda_kernel(query: Tensor, value_dim: int, k: int, layout: RaggedLayout):
    call = SearchCall(
        device_type="cuda", dtype=query.dtype, k=k, head_dim=query.shape[-1], max_nodes=layout.max_nodes,
        queries_differ=False, shared_memory=shared_memory_limit(query.device),
    )
    if cuda_plan(call, value_dim) is None:
        return None
    from kmipgt.ops.triton_attention import triton_kmip_attention

    return lambda q, key, v, scale: triton_kmip_attention(
        q, key, v, k, layout.device_ptr, layout.max_nodes, scale
    )


def _kernel(query: Tensor, value_dim: int, k: int, layout: RaggedLayout):
    if layout.num_nodes == 0:
        return None
    if query.device.type == "cpu":
        return _cpu_kernel(query, k, layout)
    if query.device.type == "cuda":
        return _cuda_kernel(query, value_dim, k, layout)
    return None


def fused_kernel_serves(query: Tensor, value: Tensor, k: int, layout: RaggedLayout) -> bool:
    """Whether :func:`fused_small_graph_attention` runs a fused kernel for these ``[N, H, d]`` queries,
    ``[N, H, d_v]`` values, ``k`` (at most the largest graph) and layout; decided on host facts alone."""
    return _kernel(query, value.shape[-1], k, layout) is not None


def fused_small_graph_attention(
    query: Tensor, key: Tensor, value: Tensor, k: int, layout: RaggedLayout, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
    """k-MIP attention of a batch of small graphs by a fused kernel, or None where none serves the call.

    Args:
        query, key: ``[N, H, d]`` (queries are the keys). value: ``[N, H, d_v]``.
        k: keys per query, at most the largest graph.
        layout: the batch's layout.
        scale: logit scale.

    Returns:
        ``(out [N, H, d_v], index [N, H, k], score [N, H, k], weight [N, H, k])``, as
        :func:`~kmipgt.ops.kmip_attention` with ``return_selection`` and no dropout; ``out`` carries the
        gradients to query, key and value.
    """
    kernel = _kernel(query, value.shape[-1], k, layout)
    if kernel is None:
        return None
    out, index, score, weight = kernel(query, key, value, scale)
    return out, index, score.to(query.dtype), weight
