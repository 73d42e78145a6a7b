"""The task a config leaves open, read from the data: the level from the data's form, the loss and metric from
the labels.

- the level: one graph is a node-level task; a set of graphs is graph level where each graph has one label,
  node level where every node has one (segmentation). Link prediction is never guessed (``task.level:
  edge``);
- the loss and the metric, from the training labels: integer class ids are classification
  (``cross_entropy``), scored by ROC-AUC for two classes and by accuracy for more; a 0/1 matrix is
  multi-label (``bce``, average precision); other numbers are regression (``l1``, MAE); link prediction is
  ``bce`` scored by ROC-AUC.

What the config sets wins; :func:`resolve_task` fills in the rest and logs one line saying what it chose.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence

import torch
from torch_geometric.data import Data

from kmipgt.train.choices import LOSS_METRICS
from kmipgt.train.config import TaskConfig
from kmipgt.train.validation import check_loss_metrics

__all__ = ["infer_level", "labels_task", "resolve_task"]

logger = logging.getLogger(__name__)


def infer_level(raw: Data | Mapping[str, Sequence[Data]]) -> str:
    """``node`` for one graph or a set whose graphs have a label per node, else ``graph``."""
    if isinstance(raw, Data):
        return "node"
    first = next(iter(raw.values()))[0]
    y = first.get("y")
    per_node = y is not None and y.dim() >= 1 and y.size(0) == first.num_nodes and first.num_nodes > 1
    return "node" if per_node else "graph"


def _is_binary(labels: torch.Tensor) -> bool:
    known = labels[~labels.isnan()] if labels.is_floating_point() else labels
    return bool(((known == 0) | (known == 1)).all())


def labels_task(labels: torch.Tensor) -> tuple[str, str, str]:
    """``(loss, metric, what)`` for training labels ``[R]`` or ``[R, L]`` (``what``: how the labels read)."""
    if labels.dim() == 2 and labels.size(1) == 1 and not labels.is_floating_point():
        labels = labels.view(-1)  # class ids stored as a column
    if labels.dim() == 2 and labels.size(1) > 1 and _is_binary(labels):
        return "bce", "ap", f"{labels.size(1)} binary labels"
    if labels.is_floating_point():
        if labels.dim() == 1 and _is_binary(labels):
            return "bce", "roc_auc", "binary labels"
        return "l1", "mae", "numeric targets"
    classes = int(labels.max()) + 1 if labels.numel() else 0
    return "cross_entropy", ("roc_auc" if classes <= 2 else "accuracy"), f"{classes} classes"


def resolve_task(
    task: TaskConfig, raw: Data | Mapping[str, Sequence[Data]], labels, official: bool = False
) -> TaskConfig:
    """``task`` with what it leaves open read from the data: the level from ``raw`` (one graph, or split
    lists), the loss and metric from ``labels`` (a function of the level giving the training labels, read
    only where needed); the metric ``official`` where the dataset has its own evaluator (``official``).
    Logs the choice; checked by :func:`check_loss_metrics`."""
    open_keys = [key for key in ("level", "loss", "metric") if getattr(task, key) is None]
    if not open_keys:
        return task
    level = task.level or infer_level(raw)
    if level == "edge":
        loss, metric, what = "bce", "roc_auc", "links"
    else:
        loss, metric, what = labels_task(labels(level))
    loss = task.loss or loss
    if official:
        metric, what = "official", f"{what}; the dataset's own evaluator"
    elif metric not in LOSS_METRICS[loss]:  # the config chose another loss: its first metric
        metric = LOSS_METRICS[loss][0]
    resolved = dataclasses.replace(task, level=level, loss=loss, metric=task.metric or metric)
    check_loss_metrics(resolved)
    logger.info(
        "task: %s level, %s loss, %s metric (read from the data: %s; set task.%s to choose)",
        resolved.level, resolved.loss, resolved.metric, what, "/".join(open_keys),
    )
    return resolved
