"""Backend ``"triton"``: exact search on CUDA with the kernel of :mod:`kmipgt.ops.search.triton_kernel`.

The optional ``triton`` package (it ships with CUDA builds of torch) is imported only on the first search,
so registering this backend costs nothing where it is never used. It takes a call where a launch plan
(:mod:`~kmipgt.ops.search.triton_plan`) fits the head dim and the k slots in the device's shared memory;
k beyond the largest graph only pads, so the kernel searches ``min(k, largest graph)`` slots.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt.ops.ragged import RaggedLayout
from kmipgt.ops.search.cuda_device import shared_memory_limit
from kmipgt.ops.search.registry import SearchBackend, SearchCall, largest_graph, register
from kmipgt.ops.search.triton_plan import search_plan

__all__ = ["MAX_TRITON_K", "TRITON_DTYPES", "topk_triton", "triton_available"]

TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# The k-best buffer lives in registers as [BLOCK_M, next_pow2(k)].
MAX_TRITON_K = 128


@functools.lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether the ``triton`` package can be imported (it ships with CUDA builds of torch)."""
    return importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def topk_triton(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, *, layout: RaggedLayout | None = None
) -> tuple[Tensor, Tensor]:
    """Exact top-k keys per query within its own graph, with the Triton kernel.

    Args:
        query: ``[N, H, d]`` CUDA queries (float32, float16 or bfloat16; scored at float32 accuracy).
        key: ``[N, H, d]`` keys, same dtype and device.
        k: keys per query: ``min(k, largest graph) <= MAX_TRITON_K``.
        ptr: ``[G + 1]`` validated CSR offsets of the graphs.
        layout: the batch's :class:`~kmipgt.ops.ragged.RaggedLayout`, whose block tables are reused.

    Returns:
        ``(scores, index)``: ``[N, H, k]`` descending scores (query dtype) and int64 global key indices,
        ties broken by lower index; ``-inf``/``-1`` beyond a graph's size.
    """
    if not triton_available():
        raise ImportError("backend='triton' needs the `triton` package (it ships with CUDA builds of torch)")
    if query.device.type != "cuda" and not _interpreting():
        raise ValueError(f"backend='triton' runs on CUDA tensors, got {query.device}; use 'fused' on the CPU")
    if query.dtype not in TRITON_DTYPES:
        raise TypeError(f"backend='triton' takes {TRITON_DTYPES}, got {query.dtype}; use backend='torch'")
    max_nodes = layout.max_nodes if layout is not None else largest_graph(ptr)
    slots = min(k, max_nodes)
    if slots > MAX_TRITON_K:
        raise ValueError(
            f"backend='triton' supports k <= {MAX_TRITON_K} (or k beyond the largest graph, which only "
            f"pads), got {k} with graphs of up to {max_nodes} nodes; use backend='torch'"
        )
    limit = shared_memory_limit(query.device)
    plan = search_plan(query.shape[-1], slots, limit)
    if plan is None:
        raise ValueError(
            f"backend='triton' has no launch plan for head dim {query.shape[-1]} within the device's "
            f"{limit} bytes of shared memory per block; use backend='torch'"
        )
    from kmipgt.ops.search.triton_kernel import launch_topk_kernel

    scores, index = launch_topk_kernel(query, key, slots, ptr, plan, layout)
    if slots == k:
        return scores, index
    return F.pad(scores, (0, k - slots), value=float("-inf")), F.pad(index, (0, k - slots), value=-1)


def _fits(call: SearchCall) -> bool:
    """Whether a launch plan fits the call's head dim and k slots in its device's shared memory."""
    return search_plan(call.head_dim, call.slots, call.shared_memory) is not None


# `available` looks `triton_available` up at call time, so a patched or cleared one is what `auto` sees.
register(SearchBackend(
    name="triton", search=topk_triton, exact=True, available=lambda: triton_available(), devices=("cuda",),
    dtypes=TRITON_DTYPES, max_k=MAX_TRITON_K, fits=_fits, takes_layout=True, auto_rank=1,
))
