"""The task base: what every task level does unless it says otherwise, the step it hands the training loop
and the view of a split's graph that attention analyses take."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch_geometric.data import Data

from kmipgt.distributed.launch import Ranks
from kmipgt.train.batches import batch_to_device
from kmipgt.train.config import Config
from kmipgt.train.datasets import SPLITS, PreparedData
from kmipgt.train.graph_features import node_coords
from kmipgt.train.metrics import compute_metric
from kmipgt.train.padding import REAL_GRAPHS

__all__ = ["SplitGraph", "Step", "Task", "check_split"]


class Step(NamedTuple):
    """One optimiser step's input: a graph or mini-batch, and the nodes the loss sees (None: every output)."""

    batch: Data
    mask: torch.Tensor | None


@dataclass
class SplitGraph:
    """One graph of a run's data and a split's nodes on it, as attention analyses take them.

    ``nodes``: ``[S]`` the split's nodes (node level: its mask; graph and edge level: every node of the
    split's graph ``index``). ``labels``: ``[N]`` classes on node-level classification, else None.
    ``train_mask``: ``[N]`` training-labelled nodes on node-level tasks, else None. ``coords``: ``[N, 2]``
    node coordinates for pictures: the dataset's ``pos``, else the first two
    ``model.encoder.coord_columns`` of x (z-scored), else None.
    """

    graph: Data
    nodes: torch.Tensor
    labels: torch.Tensor | None
    train_mask: torch.Tensor | None
    coords: torch.Tensor | None


def check_split(split: str) -> None:
    """ValueError unless ``split`` is one of :data:`~kmipgt.train.datasets.SPLITS`."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")


class Task:
    """A task level's data handling; subclasses say what differs from these defaults.

    Defaults: one full-batch step per epoch, targets in ``y``, each split scored over the graphs of its
    list (:meth:`eval_batches`). ``generator`` is the run's data RNG (shuffles, label draws): the loop
    saves it in checkpoints, so a resumed run draws the same. ``ranks``: this process's place among the
    ranks of a ``ddp`` run (None: one process).
    """

    level: ClassVar[str]

    def __init__(
        self, config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks | None = None
    ):
        self.config = config
        self.data = data
        self.generator = generator
        self.ranks = ranks

    def steps_per_epoch(self) -> int:
        """Optimiser steps in one training epoch (the LR schedule counts in steps)."""
        return 1

    def train_steps(self, device: torch.device) -> Iterable[Step]:
        """The steps of one training epoch, on ``device``."""
        raise NotImplementedError

    def target(self, batch: Data) -> torch.Tensor:
        """What the model's outputs on ``batch`` are compared with."""
        return batch.y

    def real_outputs(self, output: torch.Tensor, batch: Data) -> torch.Tensor:
        """The rows of ``output`` that belong to ``batch``'s real graphs: the first ``real_graphs`` of a
        padded batch (``data.pad_to``, :mod:`kmipgt.train.padding`), else all."""
        real = getattr(batch, REAL_GRAPHS, None)
        return output if real is None else output[:real]

    def loss_inputs(self, output: torch.Tensor, step: Step) -> tuple[torch.Tensor, torch.Tensor]:
        """``(output, target)`` the loss is computed on: those of ``step.mask``'s nodes, or all (of the real
        graphs of a padded batch)."""
        output = self.real_outputs(output, step.batch)
        target = self.target(step.batch)
        if step.mask is None:
            return output, target
        return output[step.mask], target[step.mask]

    def eval_batches(self, split: str) -> Iterable[Data]:
        """The graphs or mini-batches evaluation runs through for ``split``."""
        raise NotImplementedError

    def split_scores(self, predict: Callable[[Data], torch.Tensor], names: Sequence[str],
                     splits: Iterable[str], device: torch.device) -> Iterator[tuple[str, dict[str, float]]]:
        """``(split, {name: value})``: metrics ``names`` of each split, scored on its outputs at once
        (:meth:`split_outputs`; targets as floats of the outputs' shape unless the loss is cross-entropy)."""
        for split, output, target in self.split_outputs(predict, splits, device):
            if self.config.task.loss != "cross_entropy":
                target = target.float().view_as(output)
            yield split, {name: self.score(name, output, target) for name in names}

    def score(self, name: str, output: torch.Tensor, target: torch.Tensor) -> float:
        """Metric ``name`` of ``output`` against ``target``; ``official``: the dataset's own evaluator."""
        if name == "official":
            return self.data.official[1](output, target)
        return compute_metric(name, output, target)

    def split_outputs(
        self, predict: Callable[[Data], torch.Tensor], splits: Iterable[str], device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        """``(split, output, target)`` over every node, graph or pair of each split, ``predict`` giving
        the outputs of a graph or batch; one split at a time, so only its outputs are held."""
        for split in splits:
            outputs, targets = [], []
            for batch in self.eval_device_batches(split, device):
                outputs.append(self.real_outputs(predict(batch), batch))
                targets.append(self.target(batch))
            yield split, torch.cat(outputs), torch.cat(targets)

    def eval_device_batches(self, split: str, device: torch.device) -> Iterator[Data]:
        """:meth:`eval_batches` of ``split`` on ``device``, as evaluation runs them."""
        return (batch_to_device(batch, device) for batch in self.eval_batches(split))

    def token_graph(self) -> Data:
        """The graph whose attention tokens a run saves: the test split's first graph."""
        return self.data.splits["test"][0]

    def split_graph(self, split: str, index: int = 0) -> SplitGraph:
        """Graph ``index`` of ``split`` and every node of it."""
        check_split(split)
        graphs = self.data.splits[split]
        if not 0 <= index < len(graphs):
            raise ValueError(f"graph {index} does not exist: split {split!r} has {len(graphs)} graphs")
        graph = graphs[index]
        return self._split_view(graph, torch.arange(graph.num_nodes), None, None)

    def _split_view(
        self, graph: Data, nodes: torch.Tensor, labels: torch.Tensor | None, train_mask: torch.Tensor | None
    ) -> SplitGraph:
        coords = node_coords(graph, self.config.model.encoder.coord_columns)
        return SplitGraph(graph, nodes, labels, train_mask, coords)
