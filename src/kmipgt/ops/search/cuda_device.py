"""The CUDA device a Triton kernel is launched on: the shared memory a block of it may use, and its context.

Triton launches on the current CUDA device and its stream, not on the device of the tensors it is handed;
a model on ``cuda:1`` would otherwise run GPU 1's pointers on GPU 0. Every launch therefore enters
:func:`device_guard` of its inputs. The shared-memory limit is what the launch plans of the kernels
(:mod:`~kmipgt.ops.search.triton_plan`, :mod:`~kmipgt.ops.triton_attention_plan`) are sized against.
"""

from __future__ import annotations

import contextlib
import functools

import torch

__all__ = ["SM90_SHARED_MEMORY", "device_guard", "shared_memory_limit"]

# Bytes of shared memory one block may opt in to on sm_90 (H100, H200): 227 KiB. Triton's interpreter
# runs the CPU tensors of the tests with the plan of this device.
SM90_SHARED_MEMORY = 232_448


@functools.cache
def _opt_in_limit(index: int) -> int:
    return torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def shared_memory_limit(device: torch.device) -> int:
    """Bytes of shared memory a kernel block may use on ``device``: the CUDA device's opt-in limit (asked
    once per device), :data:`SM90_SHARED_MEMORY` elsewhere (Triton's interpreter on CPU tensors)."""
    device = torch.device(device)
    if device.type != "cuda":
        return SM90_SHARED_MEMORY
    return _opt_in_limit(torch.cuda.current_device() if device.index is None else device.index)


def device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """The context a launch on tensors of ``device`` runs in: ``torch.cuda.device(device)`` for a CUDA
    device with an index (launches and their stream on that GPU), nothing to enter otherwise."""
    device = torch.device(device)
    if device.type != "cuda" or device.index is None:
        return contextlib.nullcontext()
    return torch.cuda.device(device)
