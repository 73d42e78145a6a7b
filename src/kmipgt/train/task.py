"""What differs between task levels, so the training loop never asks which level it trains.

One class per ``task.level``: :class:`NodeTask` (one graph, split masks, full batch), :class:`GraphTask`
(mini-batches of many graphs), :class:`NodeBatchTask` (``node`` over a set of graphs: mini-batches, a
label per node) and :class:`LinkTask` (``edge``: scored node pairs on one graph, fresh
negatives every epoch). Each says which graphs a training epoch steps through, which nodes the loss sees,
the targets, how each split is scored (on its outputs at once, or batch by batch) and which graph a
split lives on.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader
from torch_geometric.utils import negative_sampling

from kmipgt.distributed.collect import gather_rows
from kmipgt.distributed.launch import Ranks
from kmipgt.distributed.sampling import GeneratorDistributedSampler, evaluation_share, rank_batch_size
from kmipgt.nn.model import check_node_pairs
from kmipgt.ops.ragged import graph_ptr
from kmipgt.train.config import Config
from kmipgt.train.datasets import SPLITS, PreparedData, label_columns, node_coords
from kmipgt.train.metric_accumulators import SplitScores, accumulates
from kmipgt.train.metrics import compute_metric
from kmipgt.train.pad_budget import AUTO
from kmipgt.train.padding import (
    EDGE_MASK,
    NODE_MASK,
    REAL_GRAPHS,
    PadBudget,
    fitted_budgets,
    pad_to_fit,
    required_budget,
)
from kmipgt.train.resident import HOST_PTR, ResidentGraphs, graphs_nbytes, resident_by_default
from kmipgt.train.segmentation_metrics import SHAPE_METRICS, shape_parts

__all__ = [
    "TASK_CLASSES",
    "GraphTask",
    "LinkTask",
    "NodeBatchTask",
    "NodeTask",
    "SplitGraph",
    "Step",
    "Task",
    "batch_to_device",
    "forward",
    "make_task",
    "model_inputs",
    "with_fresh_negatives",
]

logger = logging.getLogger(__name__)


def model_inputs(batch: Data) -> dict[str, torch.Tensor | None]:
    """The keyword inputs of a model's forward that a graph, mini-batch or link split carries.

    The mini-batch vector and its graph offsets (graph level; the host copy of :func:`batch_to_device`
    where there is one) and the scored pairs (edge level) are read where present, so one call serves every
    level and the saved-token dump alike.
    """
    graphs = getattr(batch, "batch", None)
    # A batch packed to a fixed size (data.pad_to) marks its real rows; other batches pass no masks, so
    # models without them (the baselines' forward) are called as before.
    masks = {key: batch[key] for key in (NODE_MASK, EDGE_MASK) if getattr(batch, key, None) is not None}
    return {
        "x": batch.x,
        "edge_index": batch.edge_index,
        "batch": graphs,
        "edge_attr": batch.edge_attr,
        "lappe": getattr(batch, "lappe", None),
        "rwse": getattr(batch, "rwse", None),
        "edge_label_index": getattr(batch, "edge_label_index", None),
        "ptr": None if graphs is None else getattr(batch, HOST_PTR, getattr(batch, "ptr", None)),
        **masks,
    }


def forward(model: torch.nn.Module, batch: Data) -> torch.Tensor:
    """``model``'s output on a graph, mini-batch or link split, passing the inputs it carries
    (:func:`model_inputs`)."""
    return model(**model_inputs(batch))


def batch_to_device(batch: Data, device: torch.device) -> Data:
    """``batch`` on ``device``, its edges checked on the host first (the model only asserts their range on
    the device). A mini-batch of graphs keeps the loader's CPU ``ptr``, validated and pinned, as
    ``host_ptr``: :func:`forward` passes it to the model, so that no layer reads the graph offsets back
    from the device."""
    ptr = getattr(batch, "ptr", None)
    if ptr is not None:
        ptr = graph_ptr(batch.num_nodes, ptr=ptr)
        ptr = ptr.pin_memory() if torch.device(device).type == "cuda" else ptr
    edge_index = getattr(batch, "edge_index", None)
    if isinstance(edge_index, torch.Tensor) and edge_index.device.type == "cpu":
        check_node_pairs("edge_index", edge_index, batch.num_nodes)
    moved = batch.to(device, non_blocking=True)
    if ptr is not None:
        setattr(moved, HOST_PTR, ptr)
    return moved


def with_fresh_negatives(graph: Data) -> Data:
    """A shallow copy of a link-prediction graph scoring its positive pairs against newly sampled non-edges.

    One negative per positive, drawn with PyG's ``negative_sampling`` (Python's RNG, saved in checkpoints)
    among pairs that are not message-passing edges.
    """
    positives = graph.edge_label_index[:, graph.edge_label == 1]
    negatives = negative_sampling(graph.edge_index, graph.num_nodes, num_neg_samples=positives.size(1))
    out = copy.copy(graph)  # new label tensors only; features and encodings stay shared
    out.edge_label_index = torch.cat([positives, negatives], dim=1)
    labels = [positives.new_ones(positives.size(1)), negatives.new_zeros(negatives.size(1))]
    out.edge_label = torch.cat(labels)
    return out


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


def _check_split(split: str) -> None:
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
            yield split, {name: compute_metric(name, output, target) for name in names}

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
        _check_split(split)
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


class NodeTask(Task):
    """``node``: one graph with train/val/test masks, full batch; optionally training labels as inputs."""

    level = "node"

    def train_steps(self, device: torch.device) -> list[Step]:
        graph = self.data.graph.to(device)
        if self.config.task.label_inputs > 0:
            return [Step(*self.hide_labels(graph))]
        return [Step(graph, graph.train_mask)]

    def hide_labels(self, graph: Data) -> tuple[Data, torch.Tensor]:
        """``task.label_inputs``: a copy of ``graph`` showing the labels of a random share of the training
        nodes, and the mask of the other training nodes (those the loss is computed on)."""
        train = graph.train_mask.nonzero().view(-1).cpu()
        order = train[torch.randperm(train.numel(), generator=self.generator)]
        shown = torch.zeros_like(graph.train_mask)
        shown[order[: int(self.config.task.label_inputs * train.numel())].to(shown.device)] = True
        num_classes = self.data.out_channels
        step = graph.clone()
        step.x = torch.cat([graph.x[:, : -(num_classes + 1)], label_columns(graph.y, shown, num_classes)], 1)
        return step, graph.train_mask & ~shown

    def split_outputs(
        self, predict: Callable[[Data], torch.Tensor], splits: Iterable[str], device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        # The splits are masks of one graph: one forward pass scores them all (showing every training
        # label when label_inputs is on).
        graph = self.data.graph.to(device)
        output = predict(graph)
        for split in splits:
            mask = graph[f"{split}_mask"]
            yield split, output[mask], graph.y[mask]

    def token_graph(self) -> Data:
        return self.data.graph

    def split_graph(self, split: str, index: int = 0) -> SplitGraph:
        """The graph and the nodes of ``split``'s mask (there is one graph: ``index`` is not read)."""
        _check_split(split)
        graph = self.data.graph
        classes = self.config.task.loss == "cross_entropy" and graph.y.dim() == 1
        return self._split_view(
            graph, graph[f"{split}_mask"].nonzero().flatten(), graph.y if classes else None, graph.train_mask
        )


class GraphTask(Task):
    """``graph``: many graphs per split, in mini-batches of ``data.batch_size``, shuffled for training.

    Under ``ddp`` each rank steps through its share of every global batch and scores a contiguous share of
    each split; the outputs are gathered in rank order, so every rank scores the whole split as one process.
    Batches for a CUDA device are collated into pinned memory and copied without blocking the host. With
    ``data.on_device`` each split is collated once on the device (:class:`ResidentGraphs`) and every batch
    is cut from it: the same graphs in the same order, drawn from the generator as the loader draws them.
    """

    level = "graph"

    def __init__(
        self, config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks | None = None
    ):
        super().__init__(config, data, generator, ranks)
        self._resident: dict[tuple[str, torch.device], ResidentGraphs | None] = {}
        self._fits: dict[torch.device, bool] = {}
        if config.data.pad_to == AUTO:
            self.pad_budgets = fitted_budgets(self.data.splits.values(), config.data.batch_size)
            logger.info("data.pad_to: auto is %s", ", then ".join(map(str, self.pad_budgets)))
        else:
            budget = PadBudget.from_config(config.data.pad_to)
            self.pad_budgets = () if budget is None else (budget,)
            if budget is not None:
                self._check_budget(budget)

    def _check_budget(self, budget: PadBudget) -> None:
        """ValueError unless every batch of every split fits ``data.pad_to`` (checked once, before training:
        the largest batch shuffling can draw, not the batches of one epoch)."""
        for split, graphs in self.data.splits.items():
            if not graphs:
                continue
            needed = required_budget(graphs, self.config.data.batch_size)
            short = [f"{key} >= {getattr(needed, key)}" for key in ("nodes", "edges", "graphs")
                     if getattr(budget, key) < getattr(needed, key)]
            if short:
                raise ValueError(
                    f"config key 'data.pad_to' is too small for the {split} split's batches of "
                    f"{self.config.data.batch_size} graphs: it needs {', '.join(short)} (its largest graphs, "
                    "plus one padding node and one padding graph)"
                )

    def steps_per_epoch(self) -> int:
        return len(self._loader("train", shuffle=True))

    def train_steps(self, device: torch.device) -> Iterator[Step]:
        return (Step(batch, None) for batch in self._batches("train", True, device))

    def eval_batches(self, split: str) -> DataLoader:
        return self._loader(split, shuffle=False)

    def eval_device_batches(self, split: str, device: torch.device) -> Iterator[Data]:
        """The mini-batches of ``split`` on ``device`` in order, padded to ``data.pad_to`` where it is set."""
        return self._batches(split, False, device)

    def _batches(self, split: str, shuffle: bool, device: torch.device) -> Iterator[Data]:
        """The mini-batches of ``split`` on ``device``: cut from the resident split, or collated on the host
        (into pinned memory for a CUDA device) and copied."""
        budgets = self.pad_budgets
        resident = self._resident_split(split, device)
        if resident is not None:
            batches = (resident.batch(index) for index in self._loader(split, shuffle, indices=True))
            return (pad_to_fit(batch, budgets) for batch in batches) if budgets else batches
        loader = self._loader(split, shuffle, pin_memory=device.type == "cuda")
        if budgets:  # padded on the host, then copied
            return (batch_to_device(pad_to_fit(batch, budgets), device) for batch in loader)
        return (batch_to_device(batch, device) for batch in loader)

    def _resident_split(self, split: str, device: torch.device) -> ResidentGraphs | None:
        """``split`` kept on ``device``, or None where ``data.on_device`` (or its default) keeps it on the
        host. The default keeps it resident only where every split fits (:func:`resident_by_default`) and
        :class:`ResidentGraphs` takes the graphs (tensor attributes alone)."""
        key = (split, device)
        if key in self._resident:
            return self._resident[key]
        graphs = self.data.splits[split]
        choice = self.config.data.on_device
        if choice is None:
            choice = isinstance(graphs, Sequence) and self._all_splits_fit(device)
        try:
            self._resident[key] = ResidentGraphs(graphs, device) if choice else None
        except ValueError:
            if self.config.data.on_device:
                raise
            self._resident[key] = None  # the default: attributes that only the host's collation takes
        return self._resident[key]

    def _all_splits_fit(self, device: torch.device) -> bool:
        # Decided once per device, before a split moves there (the free memory it reads drops afterwards).
        if device not in self._fits:
            splits = self.data.splits.values()
            nbytes = sum(graphs_nbytes(graphs) for graphs in splits if isinstance(graphs, Sequence))
            self._fits[device] = resident_by_default(nbytes, device)
        return self._fits[device]

    def split_outputs(
        self, predict: Callable[[Data], torch.Tensor], splits: Iterable[str], device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        outputs = super().split_outputs(predict, splits, device)
        if self.ranks is None:
            return outputs
        return ((split, gather_rows(output), gather_rows(target)) for split, output, target in outputs)

    def _loader(
        self, split: str, shuffle: bool, indices: bool = False, pin_memory: bool = False
    ) -> TorchDataLoader:
        """The loader of ``split``'s graphs, or with ``indices`` of their indices (``[B]`` tensors): the
        same sampler either way, so both draw the same order from the generator."""
        graphs, batch_size = self.data.splits[split], self.config.data.batch_size
        items: Sequence = range(len(graphs)) if indices else graphs
        kind = TorchDataLoader if indices else DataLoader
        if self.ranks is None:
            generator = self.generator if shuffle else None
            return kind(items, batch_size=batch_size, shuffle=shuffle, generator=generator,
                        pin_memory=pin_memory)
        if shuffle:
            sampler = GeneratorDistributedSampler(items, self.ranks, self.generator)
            # The loader draws its base seed from the same generator, as one process's loader does.
            per_rank = rank_batch_size(batch_size, self.ranks)
            return kind(items, batch_size=per_rank, sampler=sampler, generator=self.generator,
                        pin_memory=pin_memory)
        share = evaluation_share(len(graphs), self.ranks)
        return kind(items[share.start:share.stop], batch_size=batch_size, pin_memory=pin_memory)


class NodeBatchTask(GraphTask):
    """``node`` over a set of graphs (inductive segmentation): :class:`GraphTask`'s mini-batches, with the
    model predicting every node and the loss and metrics taken over every node of a split's graphs.

    The shape metrics (``instance_miou``, ``class_miou``) score each graph as a shape of its ``category``
    over that category's parts (:func:`~kmipgt.train.segmentation_metrics.shape_parts`), batch by batch.
    """

    level = "node"

    def __init__(
        self, config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks | None = None
    ):
        super().__init__(config, data, generator, ranks)
        metrics = (config.task.metric, *config.task.report)
        self._category_parts = shape_parts(metrics, data.name, data.splits["train"][0])

    def split_scores(self, predict: Callable[[Data], torch.Tensor], names: Sequence[str],
                     splits: Iterable[str], device: torch.device) -> Iterator[tuple[str, dict[str, float]]]:
        """Class-id metrics summed batch by batch (:class:`SplitScores`), others as :class:`Task` does."""
        if self.config.task.loss != "cross_entropy" or not accumulates(names, self._category_parts):
            yield from super().split_scores(predict, names, splits, device)
            return
        for split in splits:
            scores = SplitScores(names, self.data.out_channels, self._category_parts)
            for batch in self.eval_device_batches(split, device):
                scores.add(predict(batch), self.target(batch), batch)
            yield split, scores.values(self.ranks)


class LinkTask(Task):
    """``edge``: link prediction, full batch; each split's graph scores its ``edge_label_index`` pairs."""

    level = "edge"

    def train_steps(self, device: torch.device) -> list[Step]:
        return [Step(with_fresh_negatives(self.data.splits["train"][0]).to(device), None)]

    def target(self, batch: Data) -> torch.Tensor:
        return batch.edge_label

    def eval_batches(self, split: str) -> list[Data]:
        return self.data.splits[split]


# ``task.level`` -> its task class
TASK_CLASSES: dict[str, type[Task]] = {task.level: task for task in (NodeTask, GraphTask, LinkTask)}


def make_task(
    config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks | None = None
) -> Task:
    """The task of ``data.level`` over ``data``, drawing its randomness from ``generator`` (on ``ranks``)."""
    if data.level not in TASK_CLASSES:
        raise ValueError(f"task level must be one of {tuple(TASK_CLASSES)}, got {data.level!r}")
    if config.data.on_device and data.level != "graph":
        raise ValueError(
            f"data.on_device needs a graph-level task (task.level: graph), got task.level {data.level!r}"
        )
    if config.data.pad_to and (data.level != "graph" or data.splits is None):
        raise ValueError(
            f"data.pad_to needs a graph-level task (task.level: graph), got task.level {data.level!r}"
        )
    if data.level == "node" and data.splits is not None:
        return NodeBatchTask(config, data, generator, ranks)
    shapes = [name for name in (config.task.metric, *config.task.report) if name in SHAPE_METRICS]
    if shapes:
        raise ValueError(f"metric {shapes[0]!r} scores shapes: it needs task.level node on a "
                         f"dataset of shapes, got task.level {data.level!r} on {data.name!r}")
    return TASK_CLASSES[data.level](config, data, generator, ranks)
