"""Atomic file writes: a crash or a full disk mid-write never leaves a truncated file behind, and a symlink
planted where a file goes is replaced, never written through.

Every file kmipgt writes goes through these functions (``tests/test_atomic_writes.py`` checks the package
for any other writer). The content goes to a temporary sibling that ``mkstemp`` creates (mode 0600, a name
no one can predict), then ``os.replace`` renames it over the target: a rename swaps the directory entry, so
whatever the entry was (a file, a symlink to someone else's file) is replaced, and what it pointed to is
left alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

__all__ = [
    "TEMP_SUFFIX",
    "atomic_write",
    "atomic_write_json",
    "atomic_write_text",
    "save_array",
    "save_figure",
    "save_named_arrays",
    "save_tensors",
    "temp_prefix",
]

# Temporary files are hidden siblings ``.<name>.<random>.tmp`` of their target: same filesystem, so the
# rename is atomic, and a run killed mid-write leaves at most such a file, never a half-written target.
TEMP_SUFFIX = ".tmp"


def temp_prefix(name: str) -> str:
    """The start of the temporary files' names of a target called ``name`` (``.<name>.``)."""
    return f".{name}."


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold SIGINT (Ctrl-C) until the block ends, then act on it as its handler would.

    A KeyboardInterrupt raised inside ``torch.save``'s writer leaves its zip container half-written, and its
    C++ cleanup then fails with an error of its own ("unexpected pos") that replaces the interrupt: the user
    would see a crash instead of the line saying how to resume. Writes are short; the interrupt waits.
    Only the main thread receives signals (elsewhere the block runs as it is).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if received and callable(previous):
            previous(signal.SIGINT, None)
        elif received and previous == signal.SIG_DFL:
            signal.raise_signal(signal.SIGINT)


def atomic_write(path: str | Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` through ``write(file)`` into a temporary sibling, flushed to disk, then renamed over it.

    Until the rename, ``path`` keeps its previous content. On any failure the temporary file is removed;
    an OSError (e.g. disk full) is re-raised naming ``path``. A Ctrl-C during the write is held until the
    file is whole (:func:`_interrupts_held`).
    """
    path = Path(path)
    descriptor, temp = tempfile.mkstemp(dir=path.parent, prefix=temp_prefix(path.name), suffix=TEMP_SUFFIX)
    try:
        with _interrupts_held():
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


def atomic_write_json(path: str | Path, content: dict[str, Any]) -> None:
    """``content`` as indented JSON at ``path``, so the numbers can be read and diffed; written atomically."""
    atomic_write_text(path, json.dumps(content, indent=2) + "\n")


def save_figure(figure: Any, path: str | Path, **options: Any) -> None:
    """``figure.savefig`` (a matplotlib figure) written atomically, in the format of ``path``'s suffix;
    ``options`` (``dpi``, ...) go to ``savefig``."""
    path = Path(path)
    atomic_write(path, lambda f: figure.savefig(f, format=path.suffix.lstrip(".") or None, **options))


def save_tensors(content: Any, path: str | Path) -> None:
    """``torch.save(content)`` written atomically (``content``: tensors and plain values)."""
    # Imported on use: the commands that read configs and sweeps write through this module without torch.
    import torch

    atomic_write(path, lambda f: torch.save(content, f))


def save_array(path: str | Path, array: np.ndarray) -> None:
    """``np.save`` of ``array`` (an ``.npy`` file) written atomically."""
    atomic_write(path, lambda f: np.save(f, array))


def save_named_arrays(
    path: str | Path, arrays: Mapping[str, np.ndarray], *, compressed: bool = False
) -> None:
    """``np.savez`` (``np.savez_compressed`` where ``compressed``) of the named ``arrays`` (an ``.npz``
    file) written atomically."""
    save = np.savez_compressed if compressed else np.savez
    atomic_write(path, lambda f: save(f, **arrays))
