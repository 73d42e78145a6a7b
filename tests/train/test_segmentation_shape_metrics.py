"""Instance- and class-average mIoU as a run's validation metric, against a direct per-shape computation."""

import numpy as np
import pytest
import torch

from kmipgt.data import load_dataset
from kmipgt.data.synthetic_parts import category_parts
from kmipgt.train import Trainer, load_config
from kmipgt.train.metrics import compute_metric
from kmipgt.train.segmentation_metrics import shape_metric

SHAPES = ("data.options.num_shapes=12", "data.options.num_points=64", "data.options.k=4")
TINY = ("model.num_layers=1", "model.channels=8", "model.attention.head_dim=4", "threads=1", "device=cpu",
        "optim.warmup_epochs=0", "data.batch_size=4")


def _direct(logits: torch.Tensor, target: torch.Tensor, shapes) -> tuple[float, float]:
    """(instance mIoU, class mIoU): per shape the mean over its category's parts of |pred & target| /
    |pred | target| (1 for a part in neither), averaged over shapes, and over categories of shapes."""
    pred, start, per_shape = logits.argmax(1).tolist(), 0, []
    target = target.tolist()
    for shape in shapes:
        p, t = pred[start:start + shape.num_nodes], target[start:start + shape.num_nodes]
        start += shape.num_nodes
        ious = []
        for part in category_parts()[int(shape.category)]:
            union = sum(a == part or b == part for a, b in zip(p, t, strict=True))
            hits = sum(a == part and b == part for a, b in zip(p, t, strict=True))
            ious.append(1.0 if union == 0 else hits / union)
        per_shape.append((int(shape.category), np.mean(ious)))
    by_category = {c: np.mean([iou for k, iou in per_shape if k == c]) for c, _ in per_shape}
    return np.mean([iou for _, iou in per_shape]), np.mean(list(by_category.values()))


def test_shape_mious_score_each_epoch_and_match_a_direct_computation(tmp_path):
    overrides = [*SHAPES, *TINY, "optim.epochs=2", "task.metric=instance_miou",
                 "task.report=[class_miou, macro_f1]", f"out_dir={tmp_path / 'run'}"]
    trainer = Trainer(load_config("synthetic_parts", overrides))
    metrics = trainer.fit(progress=False)
    assert metrics["metric"] == "instance_miou" and set(metrics["report"]) == {"class_miou", "macro_f1"}
    assert [row["epoch"] for row in trainer.state.history] == [1, 2]
    assert all(0.0 <= row[split] <= 1.0 for row in trainer.state.history for split in ("val", "test"))
    raw = load_dataset("synthetic_parts", num_shapes=12, num_points=64, k=4)
    trainer.model.eval()
    splits, names = ("train", "val", "test"), ["instance_miou", "class_miou", "macro_f1"]
    with torch.no_grad():
        outputs = list(trainer.task.split_outputs(trainer._predict, splits, trainer.device))
        scores = dict(trainer.task.split_scores(trainer._predict, names, splits, trainer.device))
    for split, logits, target in outputs:
        instance, per_class = _direct(logits, target, raw[split])
        assert scores[split]["instance_miou"] == pytest.approx(instance)
        assert scores[split]["class_miou"] == pytest.approx(per_class)
        assert scores[split]["macro_f1"] == pytest.approx(compute_metric("macro_f1", logits, target))
        assert metrics[split] == pytest.approx(instance)
        assert metrics["report"]["class_miou"][split] == pytest.approx(per_class)


@pytest.mark.parametrize("batch_size", [1, 5])
def test_a_split_scored_batch_by_batch_equals_its_outputs_scored_at_once(tmp_path, batch_size):
    overrides = [*SHAPES, *TINY, f"data.batch_size={batch_size}", "task.metric=instance_miou",
                 "task.report=[class_miou, accuracy, miou, macro_f1]", f"out_dir={tmp_path}"]
    trainer = Trainer(load_config("synthetic_parts", overrides))
    trainer.model.eval()
    splits, names = ("train", "test"), ["instance_miou", "class_miou", "accuracy", "miou", "macro_f1"]
    with torch.no_grad():
        outputs = list(trainer.task.split_outputs(trainer._predict, splits, trainer.device))
        scores = dict(trainer.task.split_scores(trainer._predict, names, splits, trainer.device))
    graphs = trainer.data.splits
    for split, logits, target in outputs:
        sizes = torch.tensor([0] + [graph.num_nodes for graph in graphs[split]])
        category = torch.cat([graph.category for graph in graphs[split]])
        at_once = {name: shape_metric(name, logits, target, sizes.cumsum(0), category, category_parts())
                   for name in names[:2]}
        at_once |= {name: compute_metric(name, logits, target) for name in names[2:]}
        assert scores[split] == pytest.approx(at_once, rel=1e-6)


def test_shape_mious_need_a_dataset_of_shapes(tmp_path):
    with pytest.raises(ValueError, match="needs each point's shape"):
        compute_metric("instance_miou", torch.zeros(3, 2), torch.zeros(3, dtype=torch.long))
    config = load_config("digits_knn", ["task.metric=class_miou", f"out_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"'class_miou' scores shapes: it needs task.level node"):
        Trainer(config)
    config = load_config("synthetic_rooms", [
        "data.options.rooms_per_area=1", "data.options.num_points=64", "data.options.k=4",
        "data.options.val_blocks=4", "task.report=[instance_miou]", f"out_dir={tmp_path}"])
    with pytest.raises(ValueError, match=r"'instance_miou' scores shapes of categories.*'synthetic_rooms'"):
        Trainer(config)
