"""Checkpoints that restore a run exactly: weights, optimiser, schedule, history and every RNG state."""

from __future__ import annotations

import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kmipgt.train.atomic import atomic_write


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
    """Write ``content`` atomically (temp file, then rename), so an interrupted save never corrupts it.

    Raises OSError naming ``path`` when the write fails (e.g. disk full); the previous checkpoint stays.
    """
    atomic_write(path, lambda f: torch.save(content, f))


def load_checkpoint(path: Path, keys: tuple[str, ...] = ("model",)) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; ValueError naming the file if it is not one.

    ``keys``: entries the caller needs (a truncated or foreign file fails here, not later with a KeyError).
    """
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        # RNG states hold NumPy arrays and tuples, which the weights-only unpickler rejects; the file is ours.
        content = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a readable checkpoint ({reason}); it may be truncated") from error
    missing = [key for key in keys if not isinstance(content, dict) or key not in content]
    if missing:
        raise ValueError(f"{path} is not a kmipgt checkpoint: it lacks {missing}")
    return content
