"""How a run executes: seeds, device, learning-rate schedule, peak memory, and failures turned into
errors that say what to change."""

from __future__ import annotations

import contextlib
import math
import random
import resource

import numpy as np
import torch

from kmipgt.train.choices import PRECISIONS
from kmipgt.train.config import Config

__all__ = [
    "PRECISIONS",
    "compile_failure_hint",
    "non_finite_message",
    "out_of_memory_hint",
    "peak_memory_mb",
    "resolve_device",
    "seed_everything",
    "warmup_cosine",
]


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch so that a run is reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else is passed to ``torch.device``.

    A CUDA device with an index (``cuda:1``) also becomes the current CUDA device: what runs on the current
    device and its stream rather than on its tensors' device (Triton launches outside a device guard, the
    caching allocator's default, CUDA graphs) then runs on the configured GPU, not on GPU 0. Without CUDA
    the device is returned as it is, and torch's own error comes at its first use.
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and device.index is not None and torch.cuda.is_available():
        torch.cuda.set_device(device)
    return device


def warmup_cosine(warmup_steps: int, total_steps: int):
    """LR factor per optimiser step: linear warm-up to 1, then cosine decay to 0 at ``total_steps``."""

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


@contextlib.contextmanager
def out_of_memory_hint(config: Config):
    """Turn out-of-memory failures into an error that says what to shrink; nothing is skipped."""
    try:
        yield
    except (torch.OutOfMemoryError, MemoryError) as error:
        raise MemoryError(oom_message(config)) from error
    except RuntimeError as error:
        text = str(error)
        if "out of memory" in text or "can't allocate memory" in text or "not enough memory" in text:
            raise MemoryError(oom_message(config)) from error
        raise


@contextlib.contextmanager
def compile_failure_hint(compiled: bool):
    """With ``compiled`` (``optim.compile: true``), turn a failure of ``torch.compile`` while it traces the
    model (a TorchDynamo error, or the bare AssertionError some of its internal checks raise) into a
    RuntimeError that names the option; the model's own errors pass unchanged."""
    if not compiled:
        yield
        return
    try:
        yield
    except (torch._dynamo.exc.TorchDynamoException, AssertionError) as error:
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise RuntimeError(
            f"torch.compile failed on this model ({type(error).__name__}: {first}); train it uncompiled "
            "with optim.compile: false (docs/training.md lists what compiles)"
        ) from error


def oom_message(config: Config) -> str:
    m, a = config.model, config.model.attention
    what = f"{a.kind!r} attention" if m.kind == "gps" else f"the {m.kind!r} baseline"
    return (
        f"out of memory training {what} (k={a.k}, heads={a.heads}, channels={m.channels}, "
        f"batch_size={config.data.batch_size}). Try a smaller model.attention.k, fewer model.attention.heads "
        "or model.channels, a smaller data.batch_size, or an approximate search backend via "
        "model.attention.options.backend."
    )


def non_finite_message(loss: float, epoch: int, config: Config) -> str:
    what = "NaN" if math.isnan(loss) else "inf"
    kept = f"last.pt keeps epoch {epoch - 1}" if epoch > 1 else "nothing was saved"
    return (
        f"the training loss became {what} in epoch {epoch}, so training stopped ({kept}). "
        f"Try a smaller optim.lr (now {config.optim.lr}), gradient clipping (optim.grad_clip, now "
        f"{config.optim.grad_clip}) or optim.precision=fp32, and check the inputs for NaN or inf"
    )


def peak_memory_mb(device: torch.device) -> float:
    """Peak CUDA memory allocated by torch on ``device``, or the process's peak resident set on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
