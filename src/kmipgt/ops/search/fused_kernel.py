"""The fused CPU search kernel: build, load and call a small C++ kernel (shared by ``fused`` and ``ivf``).

Why a C++ kernel and why built this way (see docs/search.md): the blockwise ``matmul`` + ``topk`` search
spends most of its time writing a score tile to memory and reading it back for ``topk``. The kernel
(``csrc/fused_topk.cpp``) keeps a 6×16 score block in SIMD registers, compares it with each query's
current k-th best score and only inserts the rare winners, so its cost is the multiply-adds alone.
It is plain C++ with a C ABI and no torch headers, built and loaded by :mod:`kmipgt.ops.cpp_build`.
numba has no explicit SIMD vector type, so the register blocking would be left to its auto-vectorizer;
GCC vector extensions state it directly and still compile for any target. Where no compiler works,
:func:`fused_library` warns once and returns ``None``; ``fused`` and ``auto`` then use the blockwise
search, and the IVF index its torch probing.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from kmipgt.cache_dir import cache_dir
from kmipgt.ops.cpp_build import CPP_FLAGS, compiled_library, find_compiler

__all__ = [
    "FUSED_DTYPES",
    "fused_library",
    "group_probes",
    "probe_topk_fused",
    "topk_fused",
]

_SOURCE = Path(__file__).with_name("csrc") / "fused_topk.cpp"
# Module attributes rather than direct uses, so that the tests can take the compiler away or break the build.
_FLAGS = CPP_FLAGS
_compiler = find_compiler
# Inputs searched exactly in float32: half types are upcast without rounding; float64 is not
# (a float32 search would not be exact for it), so it stays on the blockwise torch search.
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Queries per thread task of the exact search: enough to amortise a key tile, small enough to balance.
_QUERY_BLOCK = 96


@functools.lru_cache(maxsize=1)
def fused_library() -> ctypes.CDLL | None:
    """The compiled fused-search library, built on first use; ``None`` (with a warning) where impossible."""
    library = compiled_library(
        _SOURCE,
        compiler=_compiler(),
        flags=_FLAGS,
        directory=cache_dir(),
        purpose="the fused CPU search",
        fallback="using the slower blockwise torch search",
    )
    if library is None:
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.kmip_topk_search.argtypes = [
        pointer,
        pointer,
        size,
        size,
        size,
        size,
        size,
        pointer,
        pointer,
        pointer,
        pointer,
        size,
        pointer,
        pointer,
        ctypes.c_int,
    ]
    library.kmip_topk_search.restype = ctypes.c_int
    library.kmip_group_probes.argtypes = [pointer, size, size, size, pointer, pointer]
    library.kmip_group_probes.restype = None
    return library


def _check_inputs(query: Tensor, key: Tensor) -> ctypes.CDLL:
    if query.device.type != "cpu" or key.device.type != "cpu":
        raise ValueError(f"the fused search runs on the CPU, got tensors on {query.device}")
    if query.dtype not in FUSED_DTYPES:
        raise TypeError(f"the fused search takes {FUSED_DTYPES}, got {query.dtype}; use backend='torch'")
    library = fused_library()
    if library is None:
        raise RuntimeError("the fused CPU search could not be built on this machine (see the warning above)")
    return library


def _long(values: Tensor) -> Tensor:
    return values.to(device="cpu", dtype=torch.long).contiguous()


def probe_topk_fused(
    query: Tensor,
    key: Tensor,
    k: int,
    key_ptr: Tensor,
    probe_ptr: Tensor,
    probe_query: Tensor,
    *,
    key_ids: Tensor | None = None,
    query_block: int = _QUERY_BLOCK,
    start: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Exact top-k of each query over the keys of the segments it probes, with the fused CPU kernel.

    Args:
        query: ``[M, H, d]`` CPU queries (float32, float16 or bfloat16; searched in float32).
        key: ``[N, H, d]`` CPU keys, same dtype, grouped into segments.
        k: keys per query (``>= 1``).
        key_ptr: ``[S + 1]`` CSR offsets of the key segments.
        probe_ptr: ``[S + 1]`` CSR offsets into ``probe_query``.
        probe_query: ``[P]`` for each segment, the ascending query rows that search it.
        key_ids: ``[N]`` int64 id reported (and tie-broken on) for each key row; default the row.
        query_block: queries per thread task (larger blocks amortise many small segments).
        start: ``(scores, index)`` float32/int64 ``[M, H, k]`` top-k lists to continue (the result of an
            earlier call); default empty.

    Returns:
        ``(scores, index)``: ``[M, H, k]`` descending scores (query dtype) and int64 key ids, ties broken by
        lower id; ``-inf``/``-1`` in slots beyond the number of keys a query probes.
    """
    library = _check_inputs(query, key)
    num_queries, heads, dim = query.shape
    key_ptr, probe_ptr, probe_query = _long(key_ptr), _long(probe_ptr), _long(probe_query)
    ids = None if key_ids is None else _long(key_ids)
    query32 = query.detach().to(torch.float32).contiguous()
    key32 = key.detach().to(torch.float32).contiguous()
    if start is None:
        scores = torch.full((num_queries, heads, k), float("-inf"))
        index = torch.full((num_queries, heads, k), -1, dtype=torch.long)
    else:
        scores, index = start[0].float().contiguous().clone(), start[1].long().contiguous().clone()
    status = library.kmip_topk_search(
        query32.data_ptr(),
        key32.data_ptr(),
        num_queries,
        heads,
        dim,
        k,
        key_ptr.numel() - 1,
        key_ptr.data_ptr(),
        None if ids is None else ids.data_ptr(),
        probe_ptr.data_ptr(),
        probe_query.data_ptr(),
        query_block,
        scores.data_ptr(),
        index.data_ptr(),
        torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError(f"the fused search could not allocate its packed keys ({tuple(key.shape)} floats)")
    return scores.to(query.dtype), index


def group_probes(probes: Tensor, num_segments: int) -> tuple[Tensor, Tensor]:
    """CSR of probe pairs by segment: ``probes`` ``[M, P]`` (segment ids) -> ``probe_ptr``, ``probe_query``.

    ``probe_query`` ``[M·P]`` lists, segment by segment, the ascending query rows probing it (a counting
    sort in the kernel library; a stable ``argsort`` of the pairs costs more than the search itself).
    """
    library = fused_library()
    if library is None:
        raise RuntimeError("the fused CPU search could not be built on this machine (see the warning above)")
    probes = _long(probes)
    probe_ptr = torch.empty(num_segments + 1, dtype=torch.long)
    probe_query = torch.empty(probes.numel(), dtype=torch.long)
    library.kmip_group_probes(
        probes.data_ptr(),
        probes.shape[0],
        probes.shape[1],
        num_segments,
        probe_ptr.data_ptr(),
        probe_query.data_ptr(),
    )
    return probe_ptr, probe_query


def topk_fused(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, *, key_ptr: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Exact top-k keys per query within its own graph, with the fused CPU kernel.

    Args:
        query: ``[M, H, d]`` CPU queries (float32, float16 or bfloat16; searched in float32).
        key: ``[N, H, d]`` CPU keys, same dtype.
        k: keys per query (``>= 1``).
        ptr: ``[G + 1]`` validated CSR offsets of the queries' graphs (:func:`kmipgt.ops.graph_ptr`).
        key_ptr: ``[G + 1]`` offsets of the keys' graphs; default ``ptr`` (the queries are the nodes).

    Returns:
        ``(scores, index)``: ``[M, H, k]`` descending scores (query dtype) and int64 global key indices,
        ties broken by lower index; ``-inf``/``-1`` in slots beyond the size of the query's key graph.

    Raises:
        RuntimeError: if the kernel cannot be built here (:func:`fused_library` returned ``None``).
    """
    # Graph g is key segment g, probed by its queries ptr[g]:ptr[g + 1]: the kernel already takes M != N.
    rows = torch.arange(query.shape[0])
    return probe_topk_fused(query, key, k, ptr if key_ptr is None else key_ptr, ptr, rows)
