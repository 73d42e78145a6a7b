"""Where kmipgt keeps what it computes once per machine (labels, simplified OSM graphs, converted LRGB
copies, the compiled fused search kernel): ``$KMIPGT_CACHE``, the one variable that moves it.

What is read back from the cache is trusted (a compiled kernel is loaded and runs), so the cache is used
only where no one but this user could have put files there: the folder must belong to the user and be
writable by no one else. Otherwise a private temporary folder stands in for it, for this process only.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["cache_dir", "configured_cache_dir", "owned_privately", "private_folder"]

_log = logging.getLogger(__name__)


def configured_cache_dir() -> Path:
    """``$KMIPGT_CACHE`` if set, else ``$XDG_CACHE_HOME/kmipgt``, else ``~/.cache/kmipgt``."""
    if os.environ.get("KMIPGT_CACHE"):
        return Path(os.environ["KMIPGT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kmipgt"


def owned_privately(path: Path) -> bool:
    """Whether ``path`` (a file or folder; a symlink counts as what it points to) belongs to this user and
    neither its group nor others may write to it."""
    status = path.stat()
    return status.st_uid == os.geteuid() and not status.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


@functools.cache
def _stand_in(folder: Path, reason: str) -> tempfile.TemporaryDirectory:
    """A private temporary folder (mode 0700, removed when the process ends) for ``folder``; warns once."""
    stand_in = tempfile.TemporaryDirectory(prefix="kmipgt-")
    _log.warning("%s %s, so kmipgt neither reads nor writes there; this process uses %s instead (a folder "
                 "of your own with mode 700, or KMIPGT_CACHE set to one, keeps what is computed)",
                 folder, reason, stand_in.name)
    return stand_in


def private_folder(folder: Path, *names: str) -> Path:
    """``folder`` (created with mode 0700 where missing) when it and each of the files ``names`` in it that
    exist belong to this user and no one else may write them; else a private temporary folder.

    The temporary folder is the same for every call about ``folder`` in this process, and one warning
    line says why it is used.
    """
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if owned_privately(folder):
            paths = [folder / name for name in names]
            shared = [path.name for path in paths if path.exists() and not owned_privately(path)]
            if not shared:
                return folder
            reason = f"holds {shared[0]}, which belongs to another user or others may write"
        else:
            reason = "belongs to another user or others may write to it"
    except OSError as error:
        reason = f"cannot be used ({error.strerror})"
    return Path(_stand_in(folder, reason).name)


def cache_dir() -> Path:
    """The cache folder (:func:`configured_cache_dir`) where it is private to this user (see
    :func:`private_folder`), else a private temporary folder for this process."""
    return private_folder(configured_cache_dir())
