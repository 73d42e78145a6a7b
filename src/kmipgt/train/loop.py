"""The training loop: epochs, evaluation when due, best checkpoint, exact resume and the run's logs.

A step and the metrics of each split are :class:`~kmipgt.train.stepper.Stepper`'s, and task levels differ
only in :mod:`kmipgt.train.tasks`; this module runs the epochs of whichever task the data has.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from tqdm import tqdm

from kmipgt.atomic import atomic_write_json, atomic_write_text
from kmipgt.distributed.collect import gather_objects, run_on_main
from kmipgt.logs import quiet
from kmipgt.nn import KMIPCore
from kmipgt.train.branches import plot_branches
from kmipgt.train.checkpoint import RESUME_KEYS, load_checkpoint, rng_state, save_checkpoint, set_rng_state
from kmipgt.train.config import Config, config_differences, config_to_dict
from kmipgt.train.datasets import PreparedData
from kmipgt.train.metrics import higher_is_better
from kmipgt.train.report import plot_curves, write_csv
from kmipgt.train.runtime import non_finite_message, out_of_memory_hint, peak_memory_mb
from kmipgt.train.stepper import Stepper
from kmipgt.train.tensorboard import ScalarWriter

__all__ = ["Trainer"]

logger = logging.getLogger(__name__)


def _search_recall(model: torch.nn.Module) -> float | None:
    """Mean over the layers of the recall that calibrated approximate search reached in the last training
    step (``KMIPCore.last_recall``; ``model.attention.options: {backend: ivf}`` or ``faiss``), else None."""
    cores = [m for m in model.modules() if isinstance(m, KMIPCore)]
    recalls = [core.last_recall for core in cores if core.last_recall is not None]
    return float(np.mean(recalls)) if recalls else None


def _epoch_line(row: dict[str, Any], epochs: int) -> str:
    """The ``--verbose`` log line of one epoch's ``log.csv`` row."""
    scores = "" if row["val"] is None else f"  val {row['val']:.4f}  test {row['test']:.4f}"
    compiled = f", {row['compiled_graphs']} compiled graphs" if "compiled_graphs" in row else ""
    line = f"epoch {row['epoch']}/{epochs}: loss {row['train_loss']:.4f}{scores}"
    return f"{line}  ({row['seconds']:.1f} s{compiled})"


@dataclass
class _State:
    """Everything that changes while training and is saved in checkpoints."""

    epoch: int = 0
    best_value: float | None = None
    best_epoch: int | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer(Stepper):
    """Trains ``config``'s model on its dataset, writing checkpoints and logs to ``config.out_dir``.

    Run directory: ``config.yaml``, ``last.pt`` (every epoch, for ``resume``), ``best.pt`` (best
    validation metric), ``log.csv``, ``curves.png``, ``metrics.json`` and, on request, ``tokens.pt``,
    ``branches.png`` and ``tensorboard/``.

    Each epoch is :class:`~kmipgt.train.stepper.Stepper`'s steps (under ``distributed.strategy`` ``ddp`` or
    ``graph``, every rank's share of them); only rank 0 writes the run directory.

    ``data``: None (``config.data``'s dataset), data prepared already, or data of one's own to prepare as
    the dataset would be: a ``Data``, a list of them or a PyG ``Dataset``
    (:func:`~kmipgt.train.datasets.prepare_data`). What ``config.task`` leaves open is read from the data,
    and ``config`` (what the run saves) is the resolved one.
    """

    def __init__(self, config: Config, data: PreparedData | Any = None):
        super().__init__(config, data)
        self.run_dir = Path(config.out_dir)
        self.writes_files = self.ranks is None or self.ranks.main
        self.state = _State()
        official = self.data.official[0] if self.data.official is not None else None
        self.higher_is_better = higher_is_better(self.config.task.metric, official)
        self.metrics: dict[str, Any] | None = None  # the best checkpoint's, once training is complete

    def _is_better(self, value: float) -> bool:
        best = self.state.best_value
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best

    def _checkpoint_content(self) -> dict[str, Any]:
        """What ``last.pt`` holds; under ``ddp`` also every rank's RNG states (a collective: every rank
        calls it)."""
        content = {
            "config": config_to_dict(self.config),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "state": self.state.__dict__,
            "rng": rng_state(self.loader_generator),
        }
        if self.ranks is not None:
            # Dropout draws differ between ranks, so each rank resumes its own generators.
            content["rank_rng"] = gather_objects(content["rng"])
        return content

    def _load(self, name: str, keys: tuple[str, ...] = ("model",), trust: bool = False) -> dict[str, Any]:
        """A checkpoint of the run directory; under ``ddp`` rank 0 reads it (only it writes the run
        directory, which other hosts may not see) and every rank gets its content, or its error."""
        return run_on_main(lambda: load_checkpoint(self.run_dir / name, keys=keys, trust=trust), self.ranks)

    def _own_rng(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """This rank's saved RNG states: its own where the checkpoint has one per rank of this run."""
        per_rank = checkpoint.get("rank_rng")
        if self.ranks is not None and per_rank is not None and len(per_rank) == self.ranks.size:
            return per_rank[self.ranks.rank]
        return checkpoint["rng"]

    def resume(self, trust_checkpoint: bool = False) -> None:
        """Continue from ``last.pt`` in the run directory, restoring weights, optimiser, history and RNG.

        ``trust_checkpoint``: also read the NumPy arrays (RNG states) of a ``last.pt`` written by kmipgt 0.1.0
        (:func:`~kmipgt.train.checkpoint.load_checkpoint`).
        """
        self.restore(self._load("last.pt", keys=RESUME_KEYS, trust=trust_checkpoint))

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Restore weights, optimiser, history and RNG from the content of this run's ``last.pt`` (read with
        ``keys=RESUME_KEYS``); ValueError if it was saved with a different config. ``out_dir`` is not
        compared: the checkpoint is this run's wherever its folder now is (moved, or unpacked on another
        machine)."""
        changed = config_differences(checkpoint["config"], config_to_dict(self.config))
        changed = [key for key in changed if key != "out_dir"]
        if changed:
            raise ValueError(
                f"the config differs from the one saved in {self.run_dir / 'last.pt'} in "
                f"{', '.join(changed)}; resume with the same config (or start a new out_dir)"
            )
        self.model.load_state_dict(checkpoint["model"])
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.state = _State(**checkpoint["state"])
        set_rng_state(self._own_rng(checkpoint), self.loader_generator)

    def fit(self, stop_after: int | None = None, progress: bool = True) -> dict[str, Any]:
        """Train up to ``optim.epochs`` (or stop after epoch ``stop_after``, resumable later).

        ``progress``: a bar on stderr (also hidden when logging is quiet, :func:`kmipgt.logs.quiet`).
        Returns the final metrics (best checkpoint on validation, every split) once training is complete,
        else the metrics of the last evaluation.
        """
        opt = self.config.optim
        if self.writes_files:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            atomic_write_text(
                self.run_dir / "config.yaml", yaml.safe_dump(config_to_dict(self.config), sort_keys=False)
            )
        last_epoch = opt.epochs if stop_after is None else min(opt.epochs, stop_after)
        bar = tqdm(
            range(self.state.epoch, last_epoch),
            desc=f"train {self.data.name}",
            disable=not progress or quiet() or not self.writes_files,
            file=sys.stderr,
            initial=self.state.epoch,
            total=opt.epochs,
        )
        scalars = self._scalar_writer()
        try:
            for epoch in bar:
                self._record(self._run_epoch(epoch, bar), scalars)
        finally:
            bar.close()
            if scalars is not None:
                scalars.close()
        if self.writes_files:
            plot_curves(self.run_dir / "curves.png", self.state.history, self.config.task.metric)
        if self.branches is not None and self.writes_files:
            plot_branches(self.run_dir / "branches.png", self.state.history)
        if self.state.epoch < opt.epochs:
            return {"epochs_done": self.state.epoch, "complete": False}
        return self.finish()

    def _scalar_writer(self) -> ScalarWriter | None:
        """The TensorBoard writer of ``tensorboard: true``, continuing after the epochs already done."""
        if not self.config.tensorboard or not self.writes_files:
            return None
        return ScalarWriter(self.run_dir / "tensorboard", first_epoch=self.state.epoch + 1)

    def _run_epoch(self, epoch: int, bar: tqdm) -> dict[str, Any]:
        """Train epoch ``epoch`` (from 0), evaluate when due and keep the best checkpoint; its log row."""
        opt = self.config.optim
        start = time.perf_counter()
        with out_of_memory_hint(self.config):
            loss = self._train_epoch()
        if not math.isfinite(loss):
            raise FloatingPointError(non_finite_message(loss, epoch + 1, self.config))
        row: dict[str, Any] = {
            "epoch": epoch + 1,
            "lr": self.optimizer.param_groups[0]["lr"],
            "train_loss": loss,
            "val": None,
            "test": None,
        }
        if self.branches is not None:
            row.update(self.branches.epoch_row())
        recall = _search_recall(self.model)
        if recall is not None:
            row["search_recall"] = recall
        if (epoch + 1) % opt.eval_every == 0 or epoch + 1 == opt.epochs:
            with out_of_memory_hint(self.config):
                scores = self.evaluate(("val", "test"))
            row.update(scores)
            if self._is_better(scores["val"]):
                self.state.best_value, self.state.best_epoch = scores["val"], epoch + 1
                if self.writes_files:
                    save_checkpoint(self.run_dir / "best.pt", model=self.model.state_dict(), epoch=epoch + 1)
            bar.set_postfix(loss=f"{loss:.3f}", val=f"{scores['val']:.3f}", test=f"{scores['test']:.3f}")
        if self.compiled is not None:
            row["compiled_graphs"] = self.compiled.graphs
        row["seconds"] = time.perf_counter() - start
        return row

    def _record(self, row: dict[str, Any], scalars: ScalarWriter | None) -> None:
        """Add an epoch's row to the history, the logs and ``last.pt`` (the point a resume starts from)."""
        self.state.history.append(row)
        self.state.epoch = row["epoch"]
        logger.debug(_epoch_line(row, self.config.optim.epochs))
        # TensorBoard before last.pt: a run killed in between redoes this epoch on resume, and the
        # resumed writer purges the epoch's stale scalars; the other order would lose them.
        if scalars is not None:
            scalars.add_row(row)
        content = self._checkpoint_content()
        if self.writes_files:
            save_checkpoint(self.run_dir / "last.pt", **content)
            write_csv(self.run_dir / "log.csv", self.state.history)

    def finish(self) -> dict[str, Any]:
        """Evaluate the best checkpoint on every split and write ``metrics.json``."""
        best = self._load("best.pt")
        self.model.load_state_dict(best["model"])
        with out_of_memory_hint(self.config):
            scores = self.evaluate()
            reported = self.evaluate_metrics(self.config.task.report) if self.config.task.report else None
        seconds = [row["seconds"] for row in self.state.history]
        metrics = {
            "dataset": self.data.name,
            "metric": self.config.task.metric,
            **({"official_metric": self.data.official[0]} if self.data.official is not None else {}),
            **scores,
            "best_epoch": best["epoch"],
            "epochs": self.state.epoch,
            "seconds_per_epoch": float(np.mean(seconds)),
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "peak_memory_mb": peak_memory_mb(self.device),
            "complete": True,
        }
        if self.compiled is not None:
            metrics["compiled_graphs"] = self.compiled.graphs
        if reported is not None:
            metrics["report"] = reported
        if self.ranks is not None:
            metrics["peak_memory_mb_per_rank"] = gather_objects(metrics["peak_memory_mb"])
        if self.writes_files:
            atomic_write_json(self.run_dir / "metrics.json", metrics)
        self.metrics = metrics
        return metrics
