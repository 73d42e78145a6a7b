"""Where kmipgt keeps what it computes once per machine (labels, simplified OSM graphs, converted LRGB
copies, the compiled fused search kernel): ``$KMIPGT_CACHE``, the one variable that moves it."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """``$KMIPGT_CACHE`` if set, else ``$XDG_CACHE_HOME/kmipgt``, else ``~/.cache/kmipgt``."""
    if os.environ.get("KMIPGT_CACHE"):
        return Path(os.environ["KMIPGT_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kmipgt"
