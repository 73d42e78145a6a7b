"""A config checked end to end in seconds: a few batches of training and of each evaluation split, as one
epoch would run them, with nothing written (``kmipgt train --fast-dev-run``, ``kmipgt sweep
--fast-dev-run``).

The data are loaded and prepared, the model built and stepped by the :class:`~kmipgt.train.loop.Trainer`
that ``kmipgt train`` would use, so a wrong local-data option, a shape mismatch or a loss that is not
finite shows within the first batches rather than after an epoch. No run folder is made: only what the
loaders keep in the cache (labels, converted copies) may be written.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from itertools import islice

import torch
from torch_geometric.data import Data

from kmipgt.train.config import Config, DistributedConfig, config_to_dict
from kmipgt.train.datasets import PreparedData, prepare_data
from kmipgt.train.loop import Trainer
from kmipgt.train.losses import compute_loss
from kmipgt.train.runtime import seed_everything
from kmipgt.train.tasks.base import Step
from kmipgt.train.tasks.node import NodeTask

__all__ = ["BatchCheck", "fast_dev_run", "fast_dev_run_configs"]

EVALUATED = ("val", "test")  # what each epoch evaluates
# Per batch, the inputs whose shapes are printed.
SHOWN = ("x", "edge_index", "edge_attr", "y", "edge_label_index")


@dataclass
class BatchCheck:
    """One batch of a fast dev run: its phase (``train``, a split's name, or ``evaluation`` where one
    forward of a whole graph serves every split), its number from 1, the shapes of its inputs (and, in
    evaluation, ``output``: the model's output), ``losses``: per split, the loss and the nodes, graphs or
    pairs it averaged over, and the wall-clock seconds of the step or forward pass."""

    phase: str
    index: int
    shapes: dict[str, list[int]]
    losses: dict[str, tuple[float, int]]
    seconds: float

    def line(self) -> str:
        shapes = "  ".join(f"{key} {value}" for key, value in self.shapes.items())
        named = list(self.losses) != [self.phase]
        losses = ", ".join(f"{split + ' ' if named else ''}loss {loss:.4f} over {count} targets"
                           for split, (loss, count) in self.losses.items())
        return f"{self.phase} batch {self.index}: {shapes}  {losses}  {self.seconds:.3f} s"


def _shapes(batch: Data) -> dict[str, list[int]]:
    shapes = {key: list(batch[key].shape) for key in SHOWN if batch.get(key) is not None}
    if getattr(batch, "num_graphs", 1) > 1:
        shapes["graphs"] = [batch.num_graphs]
    return shapes


def _train_checks(trainer: Trainer, batches: int) -> Iterator[BatchCheck]:
    trainer.model.train()
    for index, step in enumerate(islice(trainer.task.train_steps(trainer.device), batches), 1):
        start = time.perf_counter()
        total, count = trainer.train_step(step)
        loss = float(total) / count  # reading the loss waits for the step, so the time is the step's
        seconds = time.perf_counter() - start
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"the training loss of batch {index} is {loss}: check the inputs for NaN or inf, or try a "
                f"smaller optim.lr (now {trainer.config.optim.lr}) or gradient clipping (optim.grad_clip)"
            )
        yield BatchCheck("train", index, _shapes(step.batch), {"train": (loss, count)}, seconds)


def _evaluated(trainer: Trainer, phase: str, index: int, batch: Data,
               masks: dict[str, torch.Tensor | None]) -> BatchCheck:
    """The check of one evaluation forward over ``batch``, scored on each split's ``masks`` (None: every
    output)."""
    start = time.perf_counter()
    output = trainer._predict(batch)
    losses = {}
    for split, mask in masks.items():
        scored, target = trainer.task.loss_inputs(output, Step(batch, mask))
        losses[split] = (float(compute_loss(trainer.config.task.loss, scored, target)), target.size(0))
    shapes = {**_shapes(batch), "output": list(output.shape)}
    return BatchCheck(phase, index, shapes, losses, time.perf_counter() - start)


@torch.no_grad()
def _evaluation_checks(trainer: Trainer, batches: int) -> Iterator[BatchCheck]:
    """Evaluation as each epoch runs it: one forward of the whole graph scored on every split's mask on a
    one-graph node task, else the first ``batches`` batches of each split."""
    trainer.model.eval()
    task = trainer.task
    if isinstance(task, NodeTask):
        graph = task.data.graph.to(trainer.device)
        masks = {split: graph[f"{split}_mask"] for split in EVALUATED}
        yield _evaluated(trainer, "evaluation", 1, graph, masks)
        return
    for split in EVALUATED:
        for index, batch in enumerate(islice(task.eval_device_batches(split, trainer.device), batches), 1):
            yield _evaluated(trainer, split, index, batch, {split: None})


def fast_dev_run(
    config: Config,
    batches: int = 2,
    echo: Callable[[str], None] = print,
    data: PreparedData | None = None,
) -> list[BatchCheck]:
    """Run ``batches`` batches of training and of each evaluation split (``val``, ``test``) of ``config``,
    as the first epoch would, and write nothing; each batch is passed to ``echo`` as one line when done.

    ``data``: ``config``'s data already prepared (:func:`~kmipgt.train.datasets.prepare_data`), to check
    several configs on the same data without preparing it again. A ``ddp`` or ``graph`` config is checked in
    this one process. A loss that is not finite is a FloatingPointError; a bad option or a missing local copy
    raises the loader's own error.
    """
    if not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be an int >= 1, got {batches!r}")
    if config.distributed.strategy != "none":
        echo(f"distributed.strategy {config.distributed.strategy}: checked in this one process")
        config = dataclasses.replace(config, distributed=DistributedConfig())
    trainer = Trainer(config, data)
    prepared = trainer.data
    parameters = sum(p.numel() for p in trainer.model.parameters())
    echo(f"{prepared.name} ({prepared.level} level): {prepared.in_channels} node features, "
         f"{prepared.edge_channels} edge features, {prepared.out_channels} outputs; "
         f"model {config.model.kind} with {parameters:,} parameters on {trainer.device}")
    checks = []
    for phase in (_train_checks(trainer, batches), _evaluation_checks(trainer, batches)):
        for check in phase:
            echo(check.line())
            checks.append(check)
    echo(f"fast dev run passed: {len(checks)} batches, nothing written")
    return checks


def _data_key(config: Config) -> str:
    """What :func:`prepare_data` reads of a config: the data and task sections and, for the random parts
    (link splits), the seed."""
    content = config_to_dict(config)
    return json.dumps([content["data"], content["task"], content["seed"]], sort_keys=True, default=str)


def fast_dev_run_configs(
    configs: Iterable[tuple[str, Config]], batches: int = 2, echo: Callable[[str], None] = print
) -> list[str]:
    """:func:`fast_dev_run` of each ``(label, config)``, one after the other, each config's data prepared
    once for every config that reads it alike. A config that fails is reported in one line
    (``<label>: failed: <error>``) and the others still run; returns the labels of those that failed."""
    prepared: dict[str, PreparedData] = {}
    failed = []
    for label, config in configs:
        echo(f"{label}:")
        key = _data_key(config)
        try:
            if key not in prepared:
                seed_everything(config.seed)  # as the Trainer seeds before it prepares the data
                prepared[key] = prepare_data(config)
            fast_dev_run(config, batches, echo, prepared[key])
        except Exception as error:
            message = str(error).strip() or type(error).__name__
            echo(f"{label}: failed: {message.splitlines()[0]}")
            failed.append(label)
    return failed
