"""Point-cloud segmentation scores: overall accuracy, mIoU over classes, and ShapeNet-Part's per-shape mIoU.

Predictions and targets are integer class ids per point. ShapeNet-Part's F1 is :func:`kmipgt.train.metrics.
macro_f1` over the part classes (scikit-learn's macro average, as GraphGPS's logger computes it). The
per-shape scores (:data:`SHAPE_METRICS`) need each point's shape and each shape's category besides the
outputs, so the node-batch task computes them from its batches of whole shapes (:func:`shape_ious` per
batch, :mod:`kmipgt.train.metric_accumulators`; :func:`shape_metric` scores a split's outputs at once).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch_geometric.data import Data

from kmipgt.data.shapenet_part import shapenet_part_category_parts
from kmipgt.data.synthetic_parts import category_parts as synthetic_category_parts
from kmipgt.train.choices import SHAPE_METRICS

__all__ = [
    "CATEGORY_PARTS",
    "SHAPE_METRICS",
    "class_iou",
    "class_miou",
    "confusion_matrix",
    "instance_miou",
    "iou_of_counts",
    "mean_iou",
    "mean_iou_of_counts",
    "overall_accuracy",
    "shape_ious",
    "shape_metric",
    "shape_parts",
]

# dataset name -> the part ids of each of its categories, as its graphs' ``category`` numbers them
CATEGORY_PARTS: dict[str, Callable[[], list[list[int]]]] = {
    "shapenet_part": shapenet_part_category_parts,
    "synthetic_parts": synthetic_category_parts,
}


def shape_parts(metrics: Sequence[str], dataset: str, graph: Data) -> list[list[int]] | None:
    """The part ids of each category of ``dataset`` (:data:`CATEGORY_PARTS`) where ``metrics`` name a
    shape metric, else None; ``graph``, one of the dataset's, must carry its ``category``."""
    wanted = [name for name in metrics if name in SHAPE_METRICS]
    if not wanted:
        return None
    if dataset not in CATEGORY_PARTS or graph.get("category") is None:
        raise ValueError(f"metric {wanted[0]!r} scores shapes of categories, on datasets "
                         f"{', '.join(CATEGORY_PARTS)}; got dataset {dataset!r}")
    return CATEGORY_PARTS[dataset]()


def _check_pair(pred: Tensor, target: Tensor) -> None:
    if pred.shape != target.shape or pred.dim() != 1:
        raise ValueError(f"pred and target must both have shape [N], got {tuple(pred.shape)} and "
                         f"{tuple(target.shape)}")


def confusion_matrix(pred: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """``[C, C]`` int64 counts: row ``t``, column ``p`` counts the points of class ``t`` predicted ``p``."""
    _check_pair(pred, target)
    if num_classes < 1:
        raise ValueError(f"num_classes must be positive, got {num_classes}")
    if pred.numel() and (min(pred.min(), target.min()) < 0 or max(pred.max(), target.max()) >= num_classes):
        raise ValueError(f"pred and target must be class ids in [0, {num_classes})")
    cells = target.long() * num_classes + pred.long()
    return torch.bincount(cells.cpu(), minlength=num_classes**2).view(num_classes, num_classes)


def overall_accuracy(pred: Tensor, target: Tensor) -> float:
    """Share of points whose predicted class is their target class (S3DIS's OA)."""
    _check_pair(pred, target)
    return (pred == target).double().mean().item()


def class_iou(pred: Tensor, target: Tensor, num_classes: int) -> Tensor:
    """``[C]`` float64 IoU per class, ``TP / (TP + FP + FN)``; NaN for a class absent from both."""
    return iou_of_counts(confusion_matrix(pred, target, num_classes))


def iou_of_counts(counts: Tensor) -> Tensor:
    """``[C]`` float64 IoU per class of a ``[C, C]`` :func:`confusion_matrix` (summed over batches, say);
    NaN for a class absent from both prediction and target."""
    counts = counts.double()
    hits = counts.diagonal()
    union = counts.sum(0) + counts.sum(1) - hits
    return torch.where(union > 0, hits / union.clamp_min(1), torch.full_like(hits, float("nan")))


def mean_iou(pred: Tensor, target: Tensor, num_classes: int) -> float:
    """Mean of :func:`class_iou` over the classes present in prediction or target (S3DIS's mIoU over its
    13 classes, pooled over every point of the split)."""
    return mean_iou_of_counts(confusion_matrix(pred, target, num_classes))


def mean_iou_of_counts(counts: Tensor) -> float:
    """Mean of :func:`iou_of_counts` over the classes present in prediction or target."""
    iou = iou_of_counts(counts)
    return iou[~iou.isnan()].mean().item()


def shape_ious(
    pred: Tensor, target: Tensor, ptr: Tensor, category: Tensor, category_parts: Sequence[Sequence[int]]
) -> Tensor:
    """``[S]`` float64 IoU of each shape over its own category's parts (the ShapeNet-Part convention).

    Args:
        pred, target: ``[N]`` part ids of the points of ``S`` shapes, shape by shape.
        ptr: ``[S + 1]`` offsets of the shapes' points (PyG's ``Batch.ptr``).
        category: ``[S]`` category id of each shape.
        category_parts: the part ids of each category.

    A shape's IoU is the mean over its category's parts of ``|pred = p and target = p| / |pred = p or
    target = p|``; a part absent from both prediction and target counts IoU 1. Predictions outside the
    category count against the parts they miss.
    """
    _check_pair(pred, target)
    if ptr.dim() != 1 or ptr.numel() != category.numel() + 1 or int(ptr[-1]) != pred.numel():
        raise ValueError(f"ptr must have shape [S + 1] ending at N = {pred.numel()}, with category [S]")
    ious = []
    for shape, cat in enumerate(category.tolist()):
        if not 0 <= cat < len(category_parts):
            raise ValueError(f"category ids must be in [0, {len(category_parts)}), got {cat}")
        p, t = pred[ptr[shape]:ptr[shape + 1]], target[ptr[shape]:ptr[shape + 1]]
        parts = torch.as_tensor(list(category_parts[cat]), dtype=torch.long, device=pred.device)
        in_pred, in_target = p[None, :] == parts[:, None], t[None, :] == parts[:, None]
        union = (in_pred | in_target).sum(1).double()
        hits = (in_pred & in_target).sum(1).double()
        ious.append(torch.where(union > 0, hits / union.clamp_min(1), torch.ones_like(union)).mean())
    return torch.stack(ious).cpu() if ious else torch.zeros(0, dtype=torch.float64)


def instance_miou(ious: Tensor) -> float:
    """Instance-average mIoU: the mean of the shapes' IoUs (:func:`shape_ious`)."""
    return ious.mean().item()


def class_miou(ious: Tensor, category: Tensor) -> float:
    """Class-average mIoU: the mean over the categories present of their shapes' mean IoU."""
    category = category.cpu()
    return torch.stack([ious[category == c].mean() for c in category.unique()]).mean().item()


def shape_metric(
    name: str,
    logits: Tensor,
    target: Tensor,
    ptr: Tensor,
    category: Tensor,
    category_parts: Sequence[Sequence[int]],
) -> float:
    """Metric ``name`` of :data:`SHAPE_METRICS` of ``logits [N, C]`` against ``target [N]`` over the ``S``
    shapes that ``ptr [S + 1]`` delimits, of categories ``category [S]`` (:func:`shape_ious`)."""
    if name not in SHAPE_METRICS:
        raise ValueError(f"name must be one of {SHAPE_METRICS}, got {name!r}")
    ious = shape_ious(logits.argmax(-1), target, ptr, category, category_parts)
    return instance_miou(ious) if name == "instance_miou" else class_miou(ious, category)
