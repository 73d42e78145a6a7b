"""Keep freed CPU buffers in the heap (glibc), so large tensors do not fault in fresh pages every step.

glibc serves every allocation above its mmap threshold (at most 32 MiB, adjusted dynamically) with fresh
``mmap`` pages that are zeroed on first touch and unmapped on free. Past that size every temporary tensor
pays page faults proportional to its bytes at every use, so an O(N) operation jumps in cost once its
buffers cross the threshold: unmasked linear attention over 4 heads x 16 channels took 0.49 s at
N = 262,144 against 0.075 s at 65,536 (x6.6 for x4 the work) with the default policy, and 0.16 s with
freed memory kept (one thread, ``kmipgt bench grf``, ``docs/benchmarks.md``). PyTorch's CPU tuning
guide recommends a caching allocator (jemalloc, tcmalloc) for the same reason; this is the
dependency-free equivalent.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["OPT_OUT_VARIABLE", "retain_freed_memory"]

OPT_OUT_VARIABLE = "KMIPGT_SYSTEM_MALLOC"
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# mallopt takes a C int: the largest thresholds it can express.
_LARGEST = 2**31 - 1


def retain_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds to 2 GiB; ``True`` if glibc accepted both.

    A freed buffer is reused by later allocations instead of returned to the kernel, so the resident set
    no longer shrinks after a peak, and fragmentation can raise the peak itself (by up to 25 % in the GRF
    benchmark). A no-op (``False``) off Linux, on a C
    library without ``mallopt`` and when the environment variable ``KMIPGT_SYSTEM_MALLOC`` is set.
    """
    if sys.platform != "linux" or os.environ.get(OPT_OUT_VARIABLE):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _LARGEST)) and bool(mallopt(_M_TRIM_THRESHOLD, _LARGEST))
