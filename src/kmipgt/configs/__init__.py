"""The configs shipped with kmipgt, found by name from any directory.

``kmipgt train --config minnesota`` (or ``configs/minnesota.yaml``, the repository's path) reads
``minnesota.yaml`` from this package; a path that exists is used as it is, so a local file wins.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["config_path", "first_comment", "list_configs"]

_SUFFIX = ".yaml"
_SWEEPS = "sweeps/"


def _shipped() -> Path:
    return Path(str(resources.files(__name__)))


def list_configs(kind: str | None = None) -> list[str]:
    """Names of the shipped configs (``minnesota``, ``sweeps/influence_of_k``, ...), sorted.

    ``kind``: ``"run"`` (configs for ``kmipgt train``), ``"sweep"`` (grids for ``kmipgt sweep``, under
    ``sweeps/``) or None (both).
    """
    if kind not in (None, "run", "sweep"):
        raise ValueError(f"kind must be 'run', 'sweep' or None, got {kind!r}")
    root = _shipped()
    names = sorted(path.relative_to(root).with_suffix("").as_posix() for path in root.rglob(f"*{_SUFFIX}"))
    if kind is None:
        return names
    return [name for name in names if name.startswith(_SWEEPS) == (kind == "sweep")]


def first_comment(name: str | Path) -> str:
    """The first comment line of config ``name`` (what the file is), without its ``#``; empty if none."""
    with open(config_path(name)) as f:
        for line in f:
            if line.startswith("#"):
                return line.lstrip("#").strip()
    return ""


def config_path(name: str | Path) -> Path:
    """The file ``name`` refers to: an existing path, else the shipped config of that name.

    Raises:
        FileNotFoundError: neither exists; the message lists the shipped run configs.
    """
    path = Path(name)
    if path.is_file():
        return path
    # Docs and sweep files name shipped configs as ``configs/<name>.yaml`` (the repository's layout).
    relative = Path(*path.parts[1:]) if path.parts[:1] == ("configs",) and len(path.parts) > 1 else path
    shipped = _shipped() / relative
    for candidate in (shipped, shipped.with_name(shipped.name + _SUFFIX)):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"no config file {str(name)!r}; shipped run configs: {', '.join(list_configs('run'))} "
        "(`kmipgt configs` lists them with the shipped sweeps)"
    )
