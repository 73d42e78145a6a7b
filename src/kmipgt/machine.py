"""The machine a measurement ran on, as the result files of benchmarks and timed training steps record it."""

from __future__ import annotations

import platform

import torch

__all__ = ["machine_info"]


def machine_info(device: str) -> dict:
    """Platform, processor, torch version and threads, and the GPU's name on a CUDA ``device``."""
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info
