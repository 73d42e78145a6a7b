"""Metrics summed batch by batch equal the same metrics of the concatenated outputs, whatever the batches."""

import pytest
import torch
from torch_geometric.data import Batch, Data

from kmipgt.distributed.launch import current_ranks
from kmipgt.train.metric_accumulators import SplitScores, accumulates
from kmipgt.train.metrics import compute_metric
from kmipgt.train.segmentation_metrics import shape_metric
from spawn_ranks import spawn_ranks

PARTS = [[0, 1], [2, 3, 4], [5]]  # category -> its part ids
NAMES = ["accuracy", "macro_f1", "miou", "instance_miou", "class_miou"]


def _shapes(seed: int, num_shapes: int = 11) -> list[Data]:
    """Shapes of 3 to 12 points, each labelled within its category's parts; logits that hit the target
    about half the time and otherwise name any of the 7 classes (class 6: never a target)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = []
    for _ in range(num_shapes):
        n = int(torch.randint(3, 13, (1,), generator=gen))
        category = int(torch.randint(0, 3, (1,), generator=gen))
        parts = torch.tensor(PARTS[category])
        y = parts[torch.randint(0, len(parts), (n,), generator=gen)]
        logits = torch.randn(n, 7, generator=gen)
        logits[torch.arange(n), y] += 2 * torch.rand(n, generator=gen)
        shapes.append(Data(y=y, logits=logits, category=torch.tensor([category]), num_nodes=n))
    return shapes


def _concatenated(shapes: list[Data], name: str) -> float:
    """``name`` of the outputs of every shape at once: the path that holds a split."""
    whole = Batch.from_data_list(shapes)
    if name in ("instance_miou", "class_miou"):
        return shape_metric(name, whole.logits, whole.y, whole.ptr, whole.category, PARTS)
    return compute_metric(name, whole.logits, whole.y)


def _accumulated(shapes: list[Data], batch_size: int, names=NAMES, ranks=None) -> dict[str, float]:
    scores = SplitScores(names, 7, PARTS)
    for start in range(0, len(shapes), batch_size):
        batch = Batch.from_data_list(shapes[start:start + batch_size])
        scores.add(batch.logits, batch.y, batch)
    return scores.values(ranks)


@pytest.mark.parametrize("batch_size", [1, 2, 4, 11])
def test_accumulated_metrics_equal_those_of_the_concatenated_outputs(batch_size):
    shapes = _shapes(0)
    values = _accumulated(shapes, batch_size)
    for name in NAMES:
        assert values[name] == pytest.approx(_concatenated(shapes, name), rel=1e-6, abs=0)


def test_batches_that_each_hold_some_classes_only():
    # Sorted by category, each batch sees the parts of one or two categories; class 6 is only predicted,
    # so macro F1 and mIoU count it with a score of 0, as on the whole split.
    shapes = sorted(_shapes(1, 15), key=lambda shape: int(shape.category))
    shapes[0].logits[:, 6] = 10.0
    for batch_size in (2, 3, 5):
        values = _accumulated(shapes, batch_size)
        for name in NAMES:
            assert values[name] == pytest.approx(_concatenated(shapes, name), rel=1e-6, abs=0)


def test_which_metrics_accumulate():
    assert accumulates(["accuracy", "miou"], None) and accumulates(NAMES, PARTS)
    assert not accumulates(["instance_miou"], None) and not accumulates(["accuracy", "ap"], PARTS)
    with pytest.raises(ValueError, match=r"names must be metrics of.*\['accuracy', 'mae'\]"):
        SplitScores(["accuracy", "mae"], 7, PARTS)
    with pytest.raises(ValueError, match="names must be metrics of"):
        SplitScores(["class_miou"], 7)


def _rank_scores(rank: int, world: int, out: str) -> None:
    """Each rank adds its contiguous share of the shapes; every rank must get the whole split's scores."""
    shapes = _shapes(2, 13)
    share = shapes[:5] if rank == 0 else shapes[5:]
    values = _accumulated(share, 3, ranks=current_ranks())
    torch.save(values, f"{out}/rank{rank}.pt")


@pytest.mark.distributed
@pytest.mark.slow  # two spawned processes, each importing torch and PyG
def test_ranks_score_the_whole_split(tmp_path):
    spawn_ranks(_rank_scores, 2, str(tmp_path / "cache"), str(tmp_path))
    expected = {name: _concatenated(_shapes(2, 13), name) for name in NAMES}
    for rank in range(2):
        values = torch.load(tmp_path / f"rank{rank}.pt")
        assert values == pytest.approx(expected, rel=1e-6, abs=0)
