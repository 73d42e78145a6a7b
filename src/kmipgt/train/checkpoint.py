"""Checkpoints that restore a run exactly: weights, optimiser, schedule, history and every RNG state."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import torch


def rng_state(loader_generator: torch.Generator | None = None) -> dict[str, Any]:
    """Current states of the Python, NumPy, torch (CPU and CUDA) and data-loader generators."""
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    if loader_generator is not None:
        state["loader"] = loader_generator.get_state()
    return state


def set_rng_state(state: dict[str, Any], loader_generator: torch.Generator | None = None) -> None:
    """Restore the generator states saved by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if loader_generator is not None and "loader" in state:
        loader_generator.set_state(state["loader"])


def save_checkpoint(path: Path, **content: Any) -> None:
    """Write ``content`` atomically (temp file, then rename), so an interrupted save never corrupts it."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(content, tmp)
    tmp.replace(path)


def load_checkpoint(path: Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`."""
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    # RNG states hold NumPy arrays and tuples, which the weights-only unpickler rejects; the file is ours.
    return torch.load(path, map_location="cpu", weights_only=False)
