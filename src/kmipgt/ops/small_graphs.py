"""Which fused small-graph k-MIP kernel serves a call: search, softmax and weighted sum in one kernel.

On a batch of small graphs (molecules, peptides) the search-then-gather path of
:func:`~kmipgt.ops.kmip_attention` spends most of its time outside the arithmetic: on the CPU in
``[N, H, k, d]`` gathers and scatters, on CUDA in launches and host round trips. The fused kernels
(:func:`kmipgt.ops.fused_attention.fused_kmip_attention` on the CPU,
:func:`kmipgt.ops.triton_attention.triton_kmip_attention` on CUDA) do a graph's scores, selection,
softmax and sum in one pass and keep only the ``[N, H, k]`` selection for the backward. They compute
the same exact top-k as the search backends (ties to the lower index) and are chosen on host facts
alone: the device, dtype, k, the batch's largest graph and graph count against the CPU threads, and no
attention dropout. Within a graph that holds a NaN or inf the result is unspecified (the CPU kernel never
selects a NaN score, the Triton kernel ranks it first), as with ``check_finite=False`` anywhere.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.ops.ragged import RaggedLayout

__all__ = ["CPU_MAX_NODES", "fused_small_graph_attention"]

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


def _cuda_kernel(query: Tensor, k: int, layout: RaggedLayout):
    from kmipgt.ops.search.backends.triton_search import TRITON_DTYPES, triton_available

    if query.dtype not in TRITON_DTYPES or not triton_available():
        return None
    from kmipgt.ops.triton_attention import MAX_FUSED_K, MAX_FUSED_NODES, triton_kmip_attention

    if layout.max_nodes > MAX_FUSED_NODES or k > MAX_FUSED_K:
        return None
    return lambda q, key, v, scale: triton_kmip_attention(
        q, key, v, k, layout.device_ptr, layout.max_nodes, scale
    )


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
    kernels = {"cpu": _cpu_kernel, "cuda": _cuda_kernel}
    if query.device.type not in kernels or layout.num_nodes == 0:
        return None
    kernel = kernels[query.device.type](query, k, layout)
    if kernel is None:
        return None
    out, index, score, weight = kernel(query, key, value, scale)
    return out, index, score.to(query.dtype), weight
