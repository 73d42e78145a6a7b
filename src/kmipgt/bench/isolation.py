"""Run one benchmark point in a fresh Python process and report its peak memory.

Peak RSS (``ru_maxrss``) is a process-wide high-water mark, so a point measured in a long-lived process
would inherit every earlier point's peak. Each point therefore runs in its own interpreter; the child
records ``ru_maxrss`` after its imports (the baseline) and again at the end, and reports the difference.
On CUDA the allocator's peak is reset and read instead. The child keeps freed memory in its heap
(:func:`kmipgt.malloc.retain_freed_memory`) like the ``kmipgt`` commands that read no config.
"""

from __future__ import annotations

import importlib
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from statistics import median

import torch

from kmipgt.child import run_python_module
from kmipgt.malloc import retain_freed_memory

__all__ = ["run_isolated", "time_calls"]

_RESULT_TAG = "KMIPGT-RESULT "


def run_isolated(target: str, params: dict, timeout: float) -> dict:
    """Call ``target`` (``"package.module:function"``) with ``params`` in a fresh interpreter.

    Returns the function's result dict plus ``peak_memory_bytes``; on a time-out, a crash, an
    out-of-memory error or a kill, a dict with ``status`` ``"skipped"`` and the ``reason``.
    """
    try:
        done = run_python_module(
            "kmipgt.bench.isolation", [target, json.dumps(params)], capture_output=True, text=True,
            timeout=timeout, check=False,
        )
    except subprocess.TimeoutExpired:
        return {"status": "skipped", "reason": f"time-out after {timeout:.0f} s"}
    for line in done.stdout.splitlines():
        if line.startswith(_RESULT_TAG):
            return json.loads(line[len(_RESULT_TAG) :])
    if done.returncode < 0:
        return {"status": "skipped", "reason": f"killed by signal {-done.returncode} (likely out of memory)"}
    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
    return {"status": "failed", "reason": " | ".join(tail)}


def time_calls(fn: Callable[[], None], repeats: int, warmup: int, device: torch.device) -> dict:
    """Wall-clock seconds of ``fn`` after ``warmup`` untimed calls: median, min, max over ``repeats``.

    ``page_faults_per_call`` counts the process's minor page faults over the timed calls: pages the kernel
    mapped because the allocator took memory fresh instead of reusing it, a cost that grows with the size
    of a call's temporaries and that wall-clock time on a shared machine hides in noise.
    """
    for _ in range(warmup):
        fn()
    times = []
    faults = _minor_faults()
    for _ in range(repeats):
        _synchronize(device)
        start = time.perf_counter()
        fn()
        _synchronize(device)
        times.append(time.perf_counter() - start)
    return {
        "time_median": median(times), "time_min": min(times), "time_max": max(times), "times": times,
        "page_faults_per_call": (_minor_faults() - faults) / repeats,
    }


def _minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _max_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _child(target: str, params: dict) -> dict:
    module_name, function_name = target.split(":")
    function = getattr(importlib.import_module(module_name), function_name)
    device = torch.device(params.get("device", "cpu"))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device)
    else:
        baseline = _max_rss_bytes()
    try:
        result = function(params)
    except (torch.OutOfMemoryError, MemoryError) as error:
        return {"status": "skipped", "reason": f"out of memory: {str(error).splitlines()[0][:200]}"}
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else _max_rss_bytes()
    return {"status": "ok", **result, "peak_memory_bytes": peak - baseline}


if __name__ == "__main__":
    # As in the `kmipgt bench` command that launched it (set KMIPGT_SYSTEM_MALLOC to compare).
    retain_freed_memory()
    outcome = _child(sys.argv[1], json.loads(sys.argv[2]))
    print(_RESULT_TAG + json.dumps(outcome), flush=True)
