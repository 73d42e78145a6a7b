"""The names a config's ``task``, ``optim`` and ``model.kind`` (and ``kmipgt predict --split``) choose among,
without importing torch.

A config is checked against these before torch loads; the modules that act on the names import them from
here.
"""

from __future__ import annotations

from kmipgt.nn.choices import BASELINE_KINDS

__all__ = [
    "LOSSES", "LOSS_METRICS", "METRICS", "MODEL_KINDS", "PRECISIONS", "PREDICTED_SPLITS", "SHAPE_METRICS",
]

LOSSES = ("cross_entropy", "bce", "l1")
# Scores over shapes: the mean IoU per shape (instance average) or per category (class average).
SHAPE_METRICS = ("instance_miou", "class_miou")
# The shape metrics need the shapes of a split: the node-batch task scores them (Task.score).
# ``official``: the dataset's own evaluator (OGB's), reported under its name.
METRICS = ("accuracy", "macro_f1", "miou", "ap", "roc_auc", "mae", *SHAPE_METRICS, "official")
# The metrics that score each loss's outputs: class scores (cross-entropy), independent binary targets'
# logits (bce), values (l1). A two-class cross-entropy model's ROC-AUC and AP score its positive class.
LOSS_METRICS = {
    "cross_entropy": ("accuracy", "macro_f1", "miou", "ap", "roc_auc", *SHAPE_METRICS, "official"),
    "bce": ("ap", "roc_auc", "accuracy", "official"),
    "l1": ("mae", "official"),
}
PRECISIONS = ("fp32", "bf16")
# ``model.kind``: the GPS graph transformer or one of the PyG baselines.
MODEL_KINDS = ("gps", *BASELINE_KINDS)
# What predictions are made for: every node, graph or pair of the data, or those of one split.
PREDICTED_SPLITS = ("all", "train", "val", "test")
