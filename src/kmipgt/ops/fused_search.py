"""Fused exact top-k inner-product search on the CPU: a small C++ kernel built once per machine.

Why a C++ kernel and why built this way (see docs/search.md): the blockwise ``matmul`` + ``topk`` search
spends most of its time writing a score tile to memory and reading it back for ``topk``. The kernel
(``csrc/fused_topk.cpp``) keeps a 6×16 score block in SIMD registers, compares it with each query's
current k-th best score and only inserts the rare winners, so its cost is the multiply-adds alone.
It is plain C++ with a C ABI and no torch headers: built with the system compiler
(``-O3 -march=native -fopenmp``) in about a second into a per-user cache, loaded with :mod:`ctypes`,
and handed tensor pointers. That needs no ninja, no torch headers and no Python-version-specific
build, unlike ``torch.utils.cpp_extension`` (which compiles the torch headers: about a minute here).
numba has no explicit SIMD vector type, so the register blocking would be left to its auto-vectorizer;
GCC vector extensions state it directly and still compile for any target. Where no compiler works,
:func:`fused_library` warns once and returns ``None``; the dispatcher then uses the blockwise search.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["FUSED_DTYPES", "fused_cache_dir", "fused_library", "topk_fused"]

_SOURCE = Path(__file__).with_name("csrc") / "fused_topk.cpp"
_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
# Inputs searched exactly in float32: half types are upcast without rounding; float64 is not
# (a float32 search would not be exact for it), so it stays on the blockwise torch search.
FUSED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def fused_cache_dir() -> Path:
    """Where the compiled kernel is cached: ``$KMIPGT_CACHE_DIR`` or ``~/.cache/kmipgt``."""
    root = os.environ.get("KMIPGT_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kmipgt"


def _cpu_signature() -> str:
    # -march=native code must not be reused on another CPU that shares the cache (e.g. NFS home).
    try:
        flags = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")]
        return flags[0] if flags else platform.processor()
    except OSError:
        return platform.processor()


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build to a private name and rename: concurrent first uses never load a half-written library.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *_FLAGS, str(_SOURCE), "-o", str(partial)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{result.stderr.strip()[-2000:]}")
        os.replace(partial, target)


@functools.lru_cache(maxsize=1)
def fused_library() -> ctypes.CDLL | None:
    """The compiled fused-search library, building it on first use; ``None`` (with a warning) if impossible."""
    compiler = _compiler()
    if compiler is None:
        warnings.warn(
            "kmipgt: no C++ compiler found (set $CXX), so the fused CPU search is unavailable; "
            "using the slower blockwise torch search",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    digest = hashlib.sha256(
        b"\0".join([_SOURCE.read_bytes(), " ".join(_FLAGS).encode(), compiler.encode(), _cpu_signature().encode()])
    ).hexdigest()[:16]
    target = fused_cache_dir() / f"fused_topk-{digest}.so"
    try:
        if not target.exists():
            _build(compiler, target)
        library = ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as error:
        warnings.warn(
            f"kmipgt: could not build the fused CPU search ({error}); using the slower blockwise torch search",
            RuntimeWarning,
            stacklevel=3,
        )
        return None
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    library.kmip_fused_topk.argtypes = [pointer, pointer, size, size, size, pointer, pointer, size, pointer,
                                        pointer, ctypes.c_int]
    library.kmip_fused_topk.restype = ctypes.c_int
    return library


def topk_fused(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, key_ptr: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Exact top-k keys per query within each segment (graph), with the fused CPU kernel.

    Args:
        query: ``[M, H, d]`` CPU queries (float32, float16 or bfloat16; searched in float32).
        key: ``[N, H, d]`` CPU keys, same dtype.
        k: keys per query (``>= 1``).
        ptr: ``[S + 1]`` validated CSR offsets of the query segments (:func:`kmipgt.ops.graph_ptr`).
        key_ptr: ``[S + 1]`` offsets of the key segments; ``None`` means ``ptr`` (self-attention).

    Returns:
        ``(scores, index)``: ``[M, H, k]`` descending scores (query dtype) and int64 key rows,
        ties broken by lower index; ``-inf``/``-1`` in slots beyond a segment's key count.

    Raises:
        RuntimeError: if the kernel cannot be built here (:func:`fused_library` returned ``None``).
    """
    if query.device.type != "cpu" or key.device.type != "cpu":
        raise ValueError(f"the fused search runs on the CPU, got tensors on {query.device}")
    if query.dtype not in FUSED_DTYPES:
        raise TypeError(f"the fused search takes {FUSED_DTYPES}, got {query.dtype}; use backend='torch'")
    library = fused_library()
    if library is None:
        raise RuntimeError("the fused CPU search could not be built on this machine (see the warning above)")
    num_queries, heads, dim = query.shape
    query_offsets = ptr.to(device="cpu", dtype=torch.long).contiguous()
    key_offsets = query_offsets if key_ptr is None else key_ptr.to(device="cpu", dtype=torch.long).contiguous()
    query32 = query.detach().to(torch.float32).contiguous()
    key32 = key.detach().to(torch.float32).contiguous()
    scores = torch.full((num_queries, heads, k), float("-inf"))
    index = torch.full((num_queries, heads, k), -1, dtype=torch.long)
    status = library.kmip_fused_topk(
        query32.data_ptr(), key32.data_ptr(), heads, dim, k, query_offsets.data_ptr(), key_offsets.data_ptr(),
        query_offsets.numel() - 1, scores.data_ptr(), index.data_ptr(), torch.get_num_threads(),
    )
    if status != 0:
        raise MemoryError(f"the fused search could not allocate its packed keys ({tuple(key.shape)} floats)")
    return scores.to(query.dtype), index
