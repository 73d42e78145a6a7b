"""Class-id metrics accumulated batch by batch, so scoring a split holds one batch's outputs, not the split's.

Accuracy, macro F1 and mIoU are functions of the split's ``[C, C]`` confusion matrix, a sum over batches
(:class:`ConfusionScores`); the shape metrics are functions of each shape's IoU, which the batch holding
the shape gives (:class:`ShapeScores`). Both equal :func:`kmipgt.train.metrics.compute_metric` and
:func:`kmipgt.train.segmentation_metrics.shape_metric` on the concatenated outputs, to float rounding.
Metrics that rank every output (``ap``, ``roc_auc``) or compare values (``mae``) are not accumulated here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data

from kmipgt.distributed.collect import gather_rows
from kmipgt.distributed.launch import Ranks
from kmipgt.train.segmentation_metrics import (
    SHAPE_METRICS,
    class_miou,
    instance_miou,
    mean_iou_of_counts,
    shape_ious,
)

__all__ = ["CONFUSION_METRICS", "ConfusionScores", "ShapeScores", "SplitScores", "accumulates"]

# Metrics of predicted against target class ids over every output of a split.
CONFUSION_METRICS = ("accuracy", "macro_f1", "miou")


class ConfusionScores:
    """A split's ``[C, C]`` confusion matrix (row: target class, column: arg-max of the logits), summed
    batch by batch, and the metrics of :data:`CONFUSION_METRICS` from it."""

    def __init__(self, num_classes: int):
        self.num_classes = num_classes
        self.counts: Tensor | None = None

    def add(self, logits: Tensor, target: Tensor) -> None:
        """Count a batch: ``logits [N, C]``, ``target [N]`` class ids (checked when the data were prepared).

        The counts stay on the logits' device, added with ``index_add_`` into a fixed ``C²`` table: no
        batch waits for the host (``bincount`` would read the largest id back to size its output).
        """
        cells = target.long() * self.num_classes + logits.argmax(-1)
        if self.counts is None:
            self.counts = torch.zeros(self.num_classes**2, dtype=torch.long, device=logits.device)
        self.counts.index_add_(0, cells, torch.ones_like(cells))

    def _table(self) -> Tensor:
        """``[C, C]`` counts on the CPU (zeros before any batch)."""
        if self.counts is None:
            return torch.zeros(self.num_classes, self.num_classes, dtype=torch.long)
        return self.counts.cpu().view(self.num_classes, self.num_classes)

    def gather(self) -> None:
        """Sum the counts of every rank (a collective: every rank calls it)."""
        self.counts = gather_rows(self._table()).view(-1, self.num_classes**2).sum(0)

    def value(self, name: str) -> float:
        """Metric ``name`` of the counts: ``accuracy`` (trace over total), ``macro_f1`` and ``miou``
        (means over the classes present in target or prediction, as scikit-learn's macro F1 and
        :func:`~kmipgt.train.segmentation_metrics.mean_iou` take them)."""
        table = self._table()
        counts = table.double()
        if name == "accuracy":
            return (counts.diagonal().sum() / counts.sum()).item()
        if name == "miou":
            return mean_iou_of_counts(table)
        if name == "macro_f1":
            marginals = counts.sum(0) + counts.sum(1)
            present = marginals > 0
            return (2 * counts.diagonal()[present] / marginals[present]).mean().item()
        raise ValueError(f"name must be one of {CONFUSION_METRICS}, got {name!r}")


class ShapeScores:
    """The IoU of every shape of a split over its category's parts (:func:`shape_ious`), batch by batch,
    and the metrics of :data:`SHAPE_METRICS` from them."""

    def __init__(self, category_parts: Sequence[Sequence[int]]):
        self.category_parts = category_parts
        self._ious: list[Tensor] = []
        self._categories: list[Tensor] = []

    def add(self, logits: Tensor, target: Tensor, ptr: Tensor, category: Tensor) -> None:
        """Score a batch of whole shapes: ``logits [N, C]``, ``target [N]``, ``ptr [S + 1]`` offsets of the
        shapes' points, ``category [S]``."""
        self._ious.append(shape_ious(logits.argmax(-1), target, ptr, category, self.category_parts))
        self._categories.append(category.cpu())

    def _joined(self) -> tuple[Tensor, Tensor]:
        """``([S] float64 IoUs, [S] categories)`` of the shapes added (``S`` may be 0 on a rank)."""
        if not self._ious:
            return torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
        return torch.cat(self._ious), torch.cat(self._categories)

    def gather(self) -> None:
        """Every rank's shapes, in rank order (a collective: every rank calls it)."""
        self._ious, self._categories = ([gather_rows(part)] for part in self._joined())

    def value(self, name: str) -> float:
        """``instance_miou`` (mean over shapes) or ``class_miou`` (mean over categories of their shapes'
        mean)."""
        ious, categories = self._joined()
        if name == "instance_miou":
            return instance_miou(ious)
        if name == "class_miou":
            return class_miou(ious, categories)
        raise ValueError(f"name must be one of {SHAPE_METRICS}, got {name!r}")


def accumulates(names: Sequence[str], category_parts: Sequence[Sequence[int]] | None) -> bool:
    """Whether every metric of ``names`` is accumulated batch by batch: one of :data:`CONFUSION_METRICS`,
    or a shape metric where the categories' parts are known."""
    shapes = category_parts is not None
    return all(name in CONFUSION_METRICS or (shapes and name in SHAPE_METRICS) for name in names)


class SplitScores:
    """Metrics ``names`` (all :func:`accumulates`) of one split, added batch by batch.

    ``num_classes``: the width ``C`` of the logits; ``category_parts``: the part ids of each category,
    for the shape metrics (batches then carry ``ptr`` and a ``category`` per graph).
    """

    def __init__(
        self, names: Sequence[str], num_classes: int, category_parts: Sequence[Sequence[int]] | None = None
    ):
        if not accumulates(names, category_parts):
            raise ValueError(f"names must be metrics of {CONFUSION_METRICS} or, with category_parts, of "
                             f"{SHAPE_METRICS}; got {list(names)}")
        self.names = list(names)
        wanted = set(self.names)
        self.confusion = ConfusionScores(num_classes) if wanted & set(CONFUSION_METRICS) else None
        self.shapes = ShapeScores(category_parts) if wanted & set(SHAPE_METRICS) else None

    def add(self, logits: Tensor, target: Tensor, batch: Data) -> None:
        """Add a mini-batch's ``logits [N, C]`` and ``target [N]``; ``batch``: its PyG ``Batch``."""
        if self.confusion is not None:
            self.confusion.add(logits, target)
        if self.shapes is not None:
            self.shapes.add(logits, target, batch.ptr, batch.category.view(-1))

    def values(self, ranks: Ranks | None = None) -> dict[str, float]:
        """``{name: value}`` over every batch added (on every rank of ``ranks``: a collective)."""
        parts = [part for part in (self.confusion, self.shapes) if part is not None]
        if ranks is not None:
            for part in parts:
                part.gather()
        return {
            name: (self.confusion if name in CONFUSION_METRICS else self.shapes).value(name)
            for name in self.names
        }
