"""On-disk cache for expensive per-graph results (labels), keyed by content hash and parameters.

It lives in :func:`kmipgt.cache_dir.cache_dir` (``$KMIPGT_CACHE``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from kmipgt import atomic
from kmipgt.cache_dir import cache_dir


def content_hash(*arrays: np.ndarray, **params: object) -> str:
    """SHA-256 (hex, 32 chars) of the arrays' dtypes, shapes and bytes plus the sorted parameters."""
    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype.str}{array.shape}".encode())
        digest.update(array.tobytes())
    digest.update(repr(sorted(params.items())).encode())
    return digest.hexdigest()[:32]


def load_array(name: str) -> np.ndarray | None:
    """The cached array stored under ``name``, or None when there is none."""
    path = cache_dir() / f"{name}.npy"
    return np.load(path) if path.exists() else None


def save_array(name: str, array: np.ndarray) -> Path:
    """Store ``array`` under ``name``, written atomically (:func:`kmipgt.atomic.save_array`)."""
    path = cache_dir() / f"{name}.npy"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.save_array(path, array)
    return path


def load_arrays(name: str) -> dict[str, np.ndarray] | None:
    """The cached named arrays stored under ``name`` (an ``.npz``), or None when there are none."""
    path = cache_dir() / f"{name}.npz"
    if not path.exists():
        return None
    with np.load(path) as stored:
        return {key: stored[key] for key in stored.files}


def save_arrays(name: str, arrays: dict[str, np.ndarray]) -> Path:
    """Store named arrays under ``name`` (a compressed ``.npz``), written atomically like
    :func:`save_array`."""
    path = cache_dir() / f"{name}.npz"
    path.parent.mkdir(parents=True, exist_ok=True)
    # Compressed: a converted dataset is carried to machines without its converter (the Peptides-func
    # graphs: 4 MB instead of 55), and inflating it costs a tenth of a second.
    atomic.save_named_arrays(path, arrays, compressed=True)
    return path
