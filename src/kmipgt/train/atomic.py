"""Atomic file writes: a crash or a full disk mid-write never leaves a truncated file behind."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

__all__ = ["TEMP_SUFFIX", "atomic_write", "atomic_write_text"]

# Temporary files are hidden siblings ``.<name>.<random>.tmp`` of their target: same filesystem, so the
# rename is atomic, and a run killed mid-write leaves at most such a file, never a half-written target.
TEMP_SUFFIX = ".tmp"


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``write(file)`` into a temporary sibling, flushed to disk, then renamed over it.

    Until the rename, ``path`` keeps its previous content. On any failure the temporary file is removed;
    an OSError (e.g. disk full) is re-raised naming ``path``.
    """
    path = Path(path)
    descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            write(handle)
            handle.flush()
            # Without fsync a power loss after the rename can leave an empty file under the new name.
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp)
        if isinstance(error, OSError):
            raise OSError(
                f"could not write {path} ({error}); its previous content, if any, is intact"
            ) from error
        raise


def atomic_write_text(path: str | Path, text: str) -> None:
    """:func:`atomic_write` of UTF-8 text."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
