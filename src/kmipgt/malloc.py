"""glibc heap policy for large CPU tensors: the config key ``allocator``, applied with ``mallopt``.

glibc serves every allocation above its mmap threshold (at most 32 MiB, adjusted dynamically) with fresh
``mmap`` pages that are zeroed on first touch and unmapped on free. Past that size every temporary tensor
pays page faults proportional to its bytes at every use, so an O(N) operation jumps in cost once its
buffers cross the threshold (measured with ``kmipgt bench grf``: docs/benchmarks.md, "GRF masked
attention"; docs/scaling.md, "Allocator: why the same run needs 2.4 or 5.6 GB"). PyTorch's CPU tuning
guide recommends a caching allocator (jemalloc, tcmalloc) for the same reason; this is the
dependency-free equivalent. Keeping freed memory costs resident memory where buffers of different sizes
interleave (activation checkpointing on large graphs, ``docs/scaling.md``; mini-batches of graphs of
varying size, whose freed holes rarely fit the next batch), hence four policies:

- ``retain``: mmap and trim thresholds at 2 GiB, freed buffers stay in the heap for reuse (the default);
- ``system``: glibc's own defaults (and its ``MALLOC_*`` environment variables), nothing set;
- ``live``: mmap threshold 1 MiB, trim threshold glibc's 128 KiB, so every buffer above 1 MiB is mapped
  on allocation and returned on free and the resident set follows live memory (what
  ``MALLOC_MMAP_THRESHOLD_=1048576`` gives).
- ``trim``: ``retain`` within a training step, and after each step every free page of the heap goes back
  to the kernel (glibc's ``malloc_trim(0)``, :func:`release_free_memory`): a step reuses its own freed
  buffers without page faults, and the holes one batch leaves do not accumulate over the next ones.

The environment variable ``KMIPGT_SYSTEM_MALLOC`` (any non-empty value) wins over the key: nothing is set,
as ``system``, so commands written before the key existed keep their meaning.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from collections.abc import Callable

__all__ = [
    "ALLOCATORS",
    "OPT_OUT_VARIABLE",
    "check_allocator",
    "effective_allocator",
    "release_free_memory",
    "retain_freed_memory",
    "use_allocator",
]

ALLOCATORS = ("retain", "system", "live", "trim")
OPT_OUT_VARIABLE = "KMIPGT_SYSTEM_MALLOC"
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# mallopt takes a C int: the largest thresholds it can express.
_LARGEST = 2**31 - 1
# glibc's DEFAULT_TRIM_THRESHOLD; ``live`` restates it so it holds whatever was set before.
_GLIBC_TRIM = 128 * 2**10
# (mmap threshold, trim threshold) per policy; ``system`` sets nothing.
THRESHOLDS = {"retain": (_LARGEST, _LARGEST), "live": (2**20, _GLIBC_TRIM), "trim": (_LARGEST, _LARGEST)}

_log = logging.getLogger(__name__)


def check_allocator(policy: str) -> None:
    """ValueError naming the config key unless ``policy`` is one of :data:`ALLOCATORS`."""
    if policy not in ALLOCATORS:
        raise ValueError(f"config key 'allocator' must be one of {ALLOCATORS}, got {policy!r}")


def effective_allocator(policy: str) -> str:
    """The policy that acts: ``system`` where ``KMIPGT_SYSTEM_MALLOC`` is set (it wins over the key, for
    the thresholds and for ``trim``'s release after each step alike), else ``policy``."""
    check_allocator(policy)
    return "system" if os.environ.get(OPT_OUT_VARIABLE) else policy


@functools.cache
def _glibc(name: str, argtypes: tuple[type, ...]) -> Callable[..., int] | str:
    """glibc's function ``name`` (returning int), or why there is none (off Linux, or another C library)."""
    if sys.platform != "linux":
        return f"platform {sys.platform}"
    try:
        function = getattr(ctypes.CDLL("libc.so.6"), name)
    except (OSError, AttributeError) as error:
        return str(error)
    function.argtypes, function.restype = list(argtypes), ctypes.c_int
    return function


def _mallopt() -> Callable[[int, int], int] | str:
    return _glibc("mallopt", (ctypes.c_int, ctypes.c_int))


@functools.cache
def _say_unavailable(policy: str, reason: str) -> None:
    """Once per process and policy; ``retain`` quietly, as every command asks for it without a config."""
    level = logging.DEBUG if policy == "retain" else logging.INFO
    _log.log(level, "no glibc mallopt here (%s): allocator %r changes nothing", reason, policy)


def use_allocator(policy: str) -> bool:
    """Apply ``policy`` (``retain``, ``system`` or ``live``); ``True`` if glibc accepted its thresholds.

    Call it before the large tensors are built: the thresholds govern later allocations only, and glibc's
    dynamic threshold, once fixed by ``mallopt``, cannot be restored, so ``system`` after another policy
    keeps that policy. ``False`` (nothing set) for ``system``, where ``KMIPGT_SYSTEM_MALLOC`` is set, and
    off glibc.
    """
    if effective_allocator(policy) == "system":
        if policy != "system":
            _log.debug("%s is set: glibc's default allocator, not allocator %r", OPT_OUT_VARIABLE, policy)
        return False
    mallopt = _mallopt()
    if isinstance(mallopt, str):
        _say_unavailable(policy, mallopt)
        return False
    mmap_threshold, trim_threshold = THRESHOLDS[policy]
    return bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))


def release_free_memory() -> bool:
    """glibc's ``malloc_trim(0)``: every whole free page in the heap goes back to the kernel; ``True`` if
    any did. Off glibc, ``False``. The training loop calls it after each step under ``allocator: trim``."""
    malloc_trim = _glibc("malloc_trim", (ctypes.c_size_t,))
    return False if isinstance(malloc_trim, str) else bool(malloc_trim(0))


def retain_freed_memory() -> bool:
    """:func:`use_allocator` ``("retain")``: the policy of commands that read no config (benchmarks, data).

    A freed buffer is reused by later allocations instead of returned to the kernel, so the resident set
    no longer shrinks after a peak, and fragmentation can raise the peak itself (by up to 25 % in the GRF
    benchmark).
    """
    return use_allocator("retain")
