"""Runs from a config or a run directory: train one, reload one, re-evaluate one, view its splits.

Each builds a :class:`~kmipgt.train.loop.Trainer` (config -> data -> model -> loop) the way ``kmipgt
train`` does, so a reloaded run sees the same data and model as the one that was trained.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from kmipgt.distributed.collect import run_on_main
from kmipgt.distributed.launch import Ranks, process_group
from kmipgt.train.checkpoint import RESUME_KEYS, load_checkpoint
from kmipgt.train.config import Config, load_config
from kmipgt.train.loop import Trainer
from kmipgt.train.rundir import prepare_run
from kmipgt.train.runtime import out_of_memory_hint, resolve_device
from kmipgt.train.tasks.base import SplitGraph
from kmipgt.train.tokens import save_first_layer_tokens

__all__ = ["evaluate_run", "load_run", "split_graph", "train"]


def train(
    config: Config,
    resume: bool = False,
    stop_after: int | None = None,
    save_tokens: bool = False,
    progress: bool = True,
    overwrite: bool = False,
    trust_checkpoint: bool = False,
) -> dict[str, Any]:
    """Train ``config`` (optionally resuming ``out_dir/last.pt``) and return the final metrics.

    The whole config and the run directory are checked first (:func:`kmipgt.train.rundir.prepare_run`):
    a directory holding another run is refused unless ``resume`` or ``overwrite``. On ``resume``,
    ``last.pt`` is read next, weights-only, before the data are built; ``trust_checkpoint`` also reads the
    NumPy arrays of one written by kmipgt 0.1.0 (refused otherwise, :func:`load_run`). With
    ``distributed.strategy`` ``ddp`` or ``graph`` this runs on every rank torchrun started (joining its
    process group unless one is initialised); rank 0 checks the run directory and writes the run.
    """
    if save_tokens and config.distributed.strategy == "graph":
        raise ValueError("save_tokens is not supported with distributed.strategy 'graph'")
    if trust_checkpoint and not resume:
        raise ValueError("trust_checkpoint (--trust-checkpoint) reads the last.pt of resume: pass it with "
                         "resume (--resume)")
    with _process_group(config) as ranks:
        # The trainer (and its DDP reducer) lives only inside this call, so it is gone before the process
        # group is destroyed: a reducer freed after its group was measured to hang the process at exit.
        return _train_run(
            config, ranks, resume, stop_after, save_tokens, progress, overwrite, trust_checkpoint
        )


def _train_run(
    config: Config, ranks: Ranks | None, resume: bool, stop_after: int | None, save_tokens: bool,
    progress: bool, overwrite: bool, trust_checkpoint: bool,
) -> dict[str, Any]:
    """:func:`train` inside its process group (``ranks``: None for one process)."""
    prepared = run_on_main(lambda: prepare_run(config, resume=resume, overwrite=overwrite), ranks)
    checkpoint = None
    if resume:
        # Rank 0 reads it (only it writes the run directory) and every rank gets its content, or its error.
        last, trust = Path(prepared.out_dir) / "last.pt", trust_checkpoint
        checkpoint = run_on_main(lambda: load_checkpoint(last, keys=RESUME_KEYS, trust=trust), ranks)
    trainer = Trainer(prepared)
    if checkpoint is not None:
        trainer.restore(checkpoint)
    metrics = trainer.fit(stop_after=stop_after, progress=progress)
    if save_tokens and metrics.get("complete") and trainer.writes_files:
        metrics["tokens"] = str(save_first_layer_tokens(trainer))
    return metrics


def _process_group(config: Config) -> contextlib.AbstractContextManager[Ranks | None]:
    """The process group of a ``ddp`` or ``graph`` run (torchrun's, unless one is initialised); None for one
    process."""
    if config.distributed.strategy == "none":
        return contextlib.nullcontext()
    return process_group(resolve_device(config.device).type)


def read_run(
    run_dir: str | Path,
    checkpoint: str = "best",
    overrides: list[str] | tuple[str, ...] = (),
    trust_checkpoint: bool = False,
) -> tuple[Config, dict[str, torch.Tensor]]:
    """A run's saved ``config.yaml`` (with ``overrides`` applied) and the model weights of its ``best.pt`` or
    ``last.pt``, read before any data: a wrong directory fails fast (FileNotFoundError); the checkpoint as
    for :func:`load_run`."""
    if checkpoint not in ("best", "last"):
        raise ValueError(f"checkpoint must be 'best' or 'last', got {checkpoint!r}")
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise FileNotFoundError(f"no config.yaml in {run_dir} (not a run directory written by kmipgt train)")
    path = run_dir / f"{checkpoint}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    config = load_config(run_dir / "config.yaml", overrides)
    return config, load_checkpoint(path, trust=trust_checkpoint)["model"]


def load_run(
    run_dir: str | Path,
    checkpoint: str = "best",
    overrides: list[str] | tuple[str, ...] = (),
    trust_checkpoint: bool = False,
) -> Trainer:
    """A run's :class:`Trainer` as ``kmipgt train`` built it, with the weights of ``best.pt`` or ``last.pt``.

    The saved ``config.yaml`` (with ``overrides`` applied) gives the dataset, model and device; both files
    are read before the dataset is loaded, so a wrong directory fails fast (FileNotFoundError). The
    checkpoint is read weights-only: one that refers to anything but tensors and plain values is refused
    (:class:`~kmipgt.safe_load.RefusedFileError`, a ValueError). The ``last.pt`` of kmipgt 0.1.0 holds NumPy
    arrays (its RNG states): ``trust_checkpoint`` reads NumPy arrays of numbers too, still nothing else
    (:func:`~kmipgt.train.checkpoint.load_checkpoint`).
    """
    config, weights = read_run(run_dir, checkpoint, overrides, trust_checkpoint)
    trainer = Trainer(config)
    trainer.model.load_state_dict(weights)
    return trainer


def evaluate_run(
    run_dir: str | Path,
    checkpoint: str = "best",
    overrides: list[str] | tuple[str, ...] = (),
    save_tokens: bool = False,
    trust_checkpoint: bool = False,
    tokens_path: str | Path | None = None,
) -> dict[str, Any]:
    """Re-evaluate a finished run's ``best.pt`` or ``last.pt`` on every split with its saved config.

    ``overrides`` (``key.sub=value``) change the saved config first, e.g. to apply a model trained on a
    10k-node synthetic city to a 262k-node one (``data.options.num_nodes=262144``) and, with
    ``save_tokens``, dump that graph's query/key tokens to ``tokens_path`` (default: ``run_dir/tokens.pt``;
    its folder must exist). The saved config's ``out_dir`` is never written to: it may point anywhere.
    ``trust_checkpoint`` as for :func:`load_run`. The config's ``task.report`` metrics come under
    ``"report"``, as in ``metrics.json``.
    """
    trainer = load_run(run_dir, checkpoint, overrides, trust_checkpoint)
    with out_of_memory_hint(trainer.config):
        metrics: dict[str, Any] = trainer.evaluate()
        if trainer.config.task.report:
            metrics["report"] = trainer.evaluate_metrics(trainer.config.task.report)
        if save_tokens:
            path = Path(tokens_path) if tokens_path is not None else Path(run_dir) / "tokens.pt"
            metrics["tokens"] = str(save_first_layer_tokens(trainer, path))
    return metrics


def split_graph(trainer: Trainer, split: str, index: int = 0) -> SplitGraph:
    """The graph that ``split`` lives on (graph ``index`` of the split on graph/edge level) and its nodes."""
    return trainer.task.split_graph(split, index)
