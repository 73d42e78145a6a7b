"""Configs and runs as the commands load them: a config's heap policy applied before any data are built."""

from __future__ import annotations

from pathlib import Path

from kmipgt.malloc import use_allocator


def load_config(path, overrides: list[str] | tuple[str, ...] = ()):
    """The run config at ``path`` with ``overrides``, checked before torch is imported (a bad value is
    reported at once), its ``allocator`` applied before any data are built."""
    from kmipgt import train
    from kmipgt.train.validation import validate_config

    config = train.load_config(path, overrides)
    validate_config(config)
    use_allocator(config.allocator)
    return config


def use_run_allocator(run_dir: Path, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Apply the ``allocator`` of a run's saved config before the run's data are loaded (a directory
    without ``config.yaml`` is left to the loader's own error)."""
    path = Path(run_dir) / "config.yaml"
    if path.is_file():
        load_config(path, overrides)
