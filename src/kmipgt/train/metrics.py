"""Evaluation metrics on model outputs: accuracy, macro-F1, mIoU, average precision, ROC-AUC, mean abs.
error."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.metrics import average_precision_score, f1_score, roc_auc_score
from torch import Tensor

from kmipgt.train.choices import METRICS, SHAPE_METRICS
from kmipgt.train.segmentation_metrics import mean_iou


def accuracy(logits: Tensor, target: Tensor) -> float:
    """Share of rows whose arg-max class equals ``target`` (``logits [N, C]``, ``target [N]``); for binary
    targets of ``logits``' shape (``bce``), the share of entries whose sign says their target."""
    if target.shape == logits.shape:
        return ((logits > 0) == (target > 0.5)).float().mean().item()
    return (logits.argmax(-1) == target).float().mean().item()


def macro_f1(logits: Tensor, target: Tensor) -> float:
    """Unweighted mean of per-class F1 over the classes present in ``target`` or predicted."""
    return float(f1_score(target.cpu().numpy(), logits.argmax(-1).cpu().numpy(), average="macro"))


def miou(logits: Tensor, target: Tensor) -> float:
    """Mean IoU over the ``C`` classes of ``logits [N, C]`` present in ``target [N]`` or predicted
    (:func:`kmipgt.train.segmentation_metrics.mean_iou`; S3DIS's segmentation score)."""
    return mean_iou(logits.argmax(-1), target, logits.size(-1))


def _binary_columns(logits: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """Scores and 0/1 labels as columns of one binary target each: ``bce`` outputs and their targets as
    they are; a cross-entropy model's ``[N, C]`` logits and ``[N]`` class ids as its positive class's
    probability (two classes) or each class against the rest (one column per class)."""
    if target.shape == logits.shape or logits.dim() == 1:
        return logits, target
    probabilities = logits.float().softmax(-1)
    if probabilities.size(-1) == 2:
        return probabilities[:, 1], target
    return probabilities, torch.nn.functional.one_hot(target.long(), probabilities.size(-1))


def _mean_over_labels(score, logits: Tensor, target: Tensor, name: str) -> float:
    """``score(labels, scores)`` per binary target column that has both classes, averaged."""
    logits, target = _binary_columns(logits, target)
    scores, labels = logits.float().cpu().numpy(), target.cpu().numpy()
    if scores.ndim == 1:
        scores, labels = scores[:, None], labels[:, None]
    per_label = [
        score(labels[:, j], scores[:, j])
        for j in range(labels.shape[1])
        if 0 < labels[:, j].sum() < labels.shape[0]
    ]
    if not per_label:
        raise ValueError(f"{name} needs at least one label with both positive and negative examples")
    return float(np.mean(per_label))


def average_precision(logits: Tensor, target: Tensor) -> float:
    """Multi-label AP averaged over labels that have a positive (LRGB's Peptides-func metric).

    ``logits [N, L]`` (or ``[N]``) scores, ``target`` of the same shape in {0, 1}; or a cross-entropy
    model's ``[N, C]`` logits and ``[N]`` class ids (:func:`_binary_columns`).
    """
    return _mean_over_labels(average_precision_score, logits, target, "average precision")


def roc_auc(logits: Tensor, target: Tensor) -> float:
    """Area under the ROC curve, averaged over labels like :func:`average_precision` (link prediction)."""
    return _mean_over_labels(roc_auc_score, logits, target, "ROC-AUC")


def mean_absolute_error(pred: Tensor, target: Tensor) -> float:
    """Mean of ``|pred - target|`` over all entries (same shapes)."""
    return (pred.float() - target.float()).abs().mean().item()


_FUNCTIONS = {
    "accuracy": accuracy,
    "macro_f1": macro_f1,
    "miou": miou,
    "ap": average_precision,
    "roc_auc": roc_auc,
    "mae": mean_absolute_error,
}


def compute_metric(name: str, output: Tensor, target: Tensor) -> float:
    """Metric ``name`` (one of :data:`METRICS` but the shape metrics) of ``output`` against ``target``."""
    if name in SHAPE_METRICS:
        raise ValueError(f"metric {name!r} needs each point's shape and category: task.level node over "
                         "a set of shapes with categories scores it")
    if name not in _FUNCTIONS:
        raise ValueError(f"metric must be one of {METRICS}, got {name!r}")
    return _FUNCTIONS[name](output, target)


# Error measures among the names a dataset's own evaluator gives its metric (OGB's).
_ERRORS = ("mae", "rmse")


def higher_is_better(name: str, official: str | None = None) -> bool:
    """Whether larger values of metric ``name`` are better (all but errors); for ``official``, of the
    evaluator's metric named ``official`` (``rocauc``, ``rmse``, ...)."""
    if name not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {name!r}")
    return (official if name == "official" else name) not in _ERRORS
