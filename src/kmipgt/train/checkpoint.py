"""Checkpoints that restore a run exactly: weights, optimiser, schedule, history and every RNG state.

Everything is stored as tensors and plain values, so a checkpoint loads with torch's weights-only
unpickler and a shared run directory cannot run code on the machine that reads it.
"""

from __future__ import annotations

import pickle
import random
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kmipgt.atomic import save_tensors
from kmipgt.safe_load import NUMPY_ARRAY_SAFE_GLOBALS, RefusedFileError, UnsafeFileError, torch_load_safely

# What resume reads from last.pt (written by Trainer._checkpoint_content).
RESUME_KEYS = ("config", "model", "optimizer", "scheduler", "state", "rng")

TRUST_HINT = (
    "; the last.pt of kmipgt 0.1.0 holds NumPy arrays (its RNG states): if this is one, --trust-checkpoint "
    "(trust_checkpoint=True in Python) reads NumPy arrays of numbers too, and still nothing else"
)


def _numpy_state(state: tuple) -> dict[str, Any]:
    """NumPy's legacy generator state ``(kind, key uint32 [624], pos, has_gauss, gauss)`` as plain values."""
    kind, key, pos, has_gauss, gauss = state
    return {"kind": str(kind), "key": torch.from_numpy(np.asarray(key, dtype=np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "gauss": float(gauss)}


def _numpy_tuple(state: dict[str, Any]) -> tuple:
    """The tuple ``np.random.set_state`` takes, from :func:`_numpy_state`."""
    key = state["key"].numpy().astype(np.uint32)
    return state["kind"], key, state["pos"], state["has_gauss"], state["gauss"]


def rng_state(loader_generator: torch.Generator | None = None) -> dict[str, Any]:
    """Current states of the Python, NumPy, torch (CPU and CUDA) and data-loader generators, as tensors and
    plain values."""
    state = {
        "python": random.getstate(),
        "numpy": _numpy_state(np.random.get_state()),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }
    if loader_generator is not None:
        state["loader"] = loader_generator.get_state()
    return state


def set_rng_state(state: dict[str, Any], loader_generator: torch.Generator | None = None) -> None:
    """Restore the generator states saved by :func:`rng_state`."""
    random.setstate(state["python"])
    np.random.set_state(_numpy_tuple(state["numpy"]))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if loader_generator is not None and "loader" in state:
        loader_generator.set_state(state["loader"])


def save_checkpoint(path: Path, **content: Any) -> None:
    """Write ``content`` atomically (temp file, then rename), so an interrupted save never corrupts it.

    Raises OSError naming ``path`` when the write fails (e.g. disk full); the previous checkpoint stays.
    """
    save_tensors(content, path)


def _current_form(content: Any) -> Any:
    """A checkpoint of kmipgt 0.1.0 with its NumPy RNG states (NumPy's tuple then) as :func:`rng_state` keeps
    them, so a resumed run writes the current form from its next epoch on."""
    if isinstance(content, dict):
        states = [content.get("rng"), *(content.get("rank_rng") or [])]
        for state in states:
            if isinstance(state, dict) and isinstance(state.get("numpy"), tuple):
                state["numpy"] = _numpy_state(state["numpy"])
    return content


def _read(path: Path, trust: bool) -> Any:
    try:
        return torch_load_safely(path, path)
    except RefusedFileError as error:
        if not error.refused.startswith("the global numpy"):
            raise
        if not trust:
            raise RefusedFileError(path, error.refused, TRUST_HINT) from None
    return _current_form(torch_load_safely(path, path, safe_globals=NUMPY_ARRAY_SAFE_GLOBALS))


def load_checkpoint(path: Path, keys: tuple[str, ...] = ("model",), *, trust: bool = False) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint`; ValueError naming the file if it is not one.

    ``keys``: entries the caller needs (a truncated or foreign file fails here, not later with a KeyError).
    The file is read weights-only (tensors and plain values; no code runs): one that refers to anything else
    raises :class:`~kmipgt.safe_load.RefusedFileError` (a ValueError) naming what it refers to. The
    ``last.pt`` of kmipgt 0.1.0 holds NumPy arrays (its NumPy RNG state): ``trust=True`` also reads NumPy
    arrays of booleans and numbers (still weights-only, nothing else) and converts that state to the
    current form. NumPy's array functions are outside what torch allows by default, and the old form is
    never read unasked.
    """
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    try:
        content = _read(path, trust)
    except UnsafeFileError:
        raise
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a readable checkpoint ({reason}); it may be truncated") from error
    missing = [key for key in keys if not isinstance(content, dict) or key not in content]
    if missing:
        raise ValueError(f"{path} is not a kmipgt checkpoint: it lacks {missing}")
    return content
