"""Segmentation scores against direct per-point computations (loops over classes and shapes)."""

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score

from kmipgt.train.metrics import compute_metric
from kmipgt.train.segmentation_metrics import (
    class_iou,
    class_miou,
    confusion_matrix,
    instance_miou,
    mean_iou,
    overall_accuracy,
    shape_ious,
    shape_metric,
)


def _direct_iou(pred, target, c):
    inter = sum(1 for p, t in zip(pred, target, strict=True) if p == c and t == c)
    union = sum(1 for p, t in zip(pred, target, strict=True) if p == c or t == c)
    return None if union == 0 else inter / union


def test_overall_accuracy_and_miou_over_13_classes():
    gen = torch.Generator().manual_seed(0)
    target = torch.randint(0, 12, (500,), generator=gen)  # class 12 never occurs
    noise = torch.randint(0, 12, (500,), generator=gen)
    pred = torch.where(torch.rand(500, generator=gen) < 0.6, target, noise)
    p, t = pred.tolist(), target.tolist()
    pairs = list(zip(p, t, strict=True))
    assert overall_accuracy(pred, target) == pytest.approx(np.mean([a == b for a, b in pairs]))
    ious = [_direct_iou(p, t, c) for c in range(13)]
    assert ious[12] is None and torch.isnan(class_iou(pred, target, 13)[12])
    assert class_iou(pred, target, 13)[:12].tolist() == pytest.approx(ious[:12])
    assert mean_iou(pred, target, 13) == pytest.approx(np.mean(ious[:12]))
    logits = torch.nn.functional.one_hot(pred, 13).float()
    assert compute_metric("miou", logits, target) == pytest.approx(np.mean(ious[:12]))
    counts = confusion_matrix(pred, target, 13)
    assert int(counts.sum()) == 500 and int(counts[3, 5]) == sum(a == 5 and b == 3 for a, b in pairs)


def test_part_f1_is_sklearn_macro_f1():
    gen = torch.Generator().manual_seed(1)
    target = torch.randint(0, 6, (200,), generator=gen)
    logits = torch.randn(200, 6, generator=gen)
    per_class = []
    pred = logits.argmax(1)
    for c in range(6):
        tp = int(((pred == c) & (target == c)).sum())
        fp, fn = int(((pred == c) & (target != c)).sum()), int(((pred != c) & (target == c)).sum())
        per_class.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    assert compute_metric("macro_f1", logits, target) == pytest.approx(np.mean(per_class))
    assert compute_metric("macro_f1", logits, target) == pytest.approx(
        f1_score(target.numpy(), pred.numpy(), average="macro"))


def test_shape_ious_use_the_category_parts_only():
    # category 0 owns parts {0, 1}, category 1 owns parts {2, 3, 4}
    parts = [[0, 1], [2, 3, 4]]
    pred = torch.tensor([0, 0, 1, 1,   2, 2, 3, 0,   2, 2, 2])
    target = torch.tensor([0, 0, 0, 1,   2, 3, 3, 3,   2, 2, 2])
    ptr, category = torch.tensor([0, 4, 8, 11]), torch.tensor([0, 1, 1])
    # shape 0: part 0 -> 2/3, part 1 -> 1/2; shape 1: part 2 -> 1/2, part 3 -> 1/3, part 4 absent -> 1;
    # shape 2: part 2 -> 1, parts 3 and 4 absent -> 1
    expected = [(2 / 3 + 1 / 2) / 2, (1 / 2 + 1 / 3 + 1) / 3, 1.0]
    ious = shape_ious(pred, target, ptr, category, parts)
    assert ious.tolist() == pytest.approx(expected)
    assert instance_miou(ious) == pytest.approx(np.mean(expected))
    assert class_miou(ious, category) == pytest.approx((expected[0] + (expected[1] + expected[2]) / 2) / 2)
    logits = torch.nn.functional.one_hot(pred, 5).float()
    instance = shape_metric("instance_miou", logits, target, ptr, category, parts)
    assert instance == pytest.approx(np.mean(expected))
    assert shape_metric("class_miou", logits, target, ptr, category, parts) == pytest.approx(
        (expected[0] + (expected[1] + expected[2]) / 2) / 2)


def test_bad_inputs():
    with pytest.raises(ValueError, match="shape"):
        overall_accuracy(torch.zeros(3), torch.zeros(4))
    with pytest.raises(ValueError, match="class ids"):
        confusion_matrix(torch.tensor([0, 3]), torch.tensor([0, 1]), 3)
    with pytest.raises(ValueError, match="ptr"):
        shape_ious(torch.zeros(4, dtype=torch.long), torch.zeros(4, dtype=torch.long), torch.tensor([0, 3]),
                   torch.tensor([0]), [[0]])
