"""Run directories: checked before anything is written, one run per directory, threads kept with the run."""

from __future__ import annotations

import dataclasses
import glob
import json
import shutil
from pathlib import Path

import torch

from kmipgt.atomic import TEMP_SUFFIX, temp_prefix
from kmipgt.train.config import Config, load_config
from kmipgt.train.validation import validate_config

__all__ = ["RUN_FILES", "RunDirError", "prepare_run"]

# Everything `kmipgt train` writes into out_dir (Trainer's docstring lists them).
RUN_FILES = (
    "config.yaml", "last.pt", "best.pt", "log.csv", "curves.png", "branches.png", "metrics.json", "tokens.pt",
    "tensorboard",
)


class RunDirError(ValueError):
    """The run directory cannot be used as asked (holds another run, or has nothing to resume)."""


def _describe(run_dir: Path, present: list[str]) -> str:
    metrics = run_dir / "metrics.json"
    try:
        finished = "metrics.json" in present and json.loads(metrics.read_text()).get("complete")
    except (OSError, ValueError, AttributeError):
        finished = False
    return f"{'a finished run' if finished else 'a run'} ({', '.join(present)})"


def _saved_threads(run_dir: Path) -> int | None:
    """``threads`` of the run's saved ``config.yaml`` (None where the run left it to torch)."""
    path = run_dir / "config.yaml"
    return load_config(path).threads if path.is_file() else None


def prepare_run(config: Config, *, resume: bool = False, overwrite: bool = False) -> Config:
    """Check ``config`` and its ``out_dir`` before a run writes anything; return the config to train.

    - every key is validated (:func:`kmipgt.train.validation.validate_config`);
    - an ``out_dir`` holding files of another run is refused (:class:`RunDirError`) unless ``resume``
      (continue its ``last.pt``) or ``overwrite`` (its run files are deleted; other files stay);
    - ``threads``: None becomes the run's saved count on ``resume``, else torch's current count, so the
      saved config records it and a resume or re-run uses the same (results depend on it).
    """
    if resume and overwrite:
        raise RunDirError("--resume continues a run and --overwrite replaces it: pass one of them")
    validate_config(config)
    run_dir = Path(config.out_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise RunDirError(f"out_dir {run_dir} is a file, not a directory")
    present = [name for name in RUN_FILES if (run_dir / name).exists()]
    if resume:
        if not (run_dir / "last.pt").is_file():
            raise RunDirError(f"nothing to resume: no checkpoint at {run_dir / 'last.pt'}")
        threads = config.threads if config.threads is not None else _saved_threads(run_dir)
    else:
        if present and not overwrite:
            raise RunDirError(
                f"{run_dir} already holds {_describe(run_dir, present)}; pass --overwrite to replace it "
                "or --resume to continue it"
            )
        for name in present:
            path = run_dir / name
            # A symlink is removed, never what it points to.
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        threads = config.threads if config.threads is not None else torch.get_num_threads()
    # Left by a run killed while writing its own files; their targets are intact. Only those: out_dir may
    # be shared, and other files there, whatever their names, are not the run's to delete.
    for name in RUN_FILES:
        for stale in run_dir.glob(f"{glob.escape(temp_prefix(name))}*{TEMP_SUFFIX}"):
            if stale.is_symlink() or not stale.is_dir():
                stale.unlink()
    return dataclasses.replace(config, threads=threads)
