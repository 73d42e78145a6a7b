"""synthetic_rooms: S3DIS-shaped blocks (features, classes, areas, split), determinism, data info."""

import pytest
import torch

from kmipgt.cli import main
from kmipgt.data import knn_graph, synthetic_rooms
from kmipgt.data.s3dis import S3DIS_CLASSES


@pytest.fixture(scope="module")
def rooms():
    return synthetic_rooms(rooms_per_area=1, seed=2, k=4, num_points=128, val_blocks=5)


def test_blocks_have_s3dis_features_classes_and_areas(rooms):
    assert len(rooms["val"]) == 5 and len(rooms["train"]) > 5 and len(rooms["test"]) > 0
    assert all(int(block.area) == 6 for block in rooms["test"])
    assert all(int(block.area) in range(1, 6) for split in ("train", "val") for block in rooms[split])
    for block in (b for split in rooms.values() for b in split):
        assert block.x.shape == (128, 9) and block.y.shape == (128,)
        assert torch.equal(block.pos, block.x[:, :3])
        # centred on the block's 1 m x 1 m cell; colours and room-normalised xyz within [0, 1]
        assert float(block.x[:, :2].abs().max()) <= 0.5 + 1e-6
        assert float(block.x[:, 3:].min()) >= 0 and float(block.x[:, 3:].max()) <= 1 + 1e-6
        assert torch.equal(block.edge_index, knn_graph(block.pos, 4))
    labels = torch.cat([b.y for split in rooms.values() for b in split])
    assert int(labels.min()) >= 0 and int(labels.max()) < len(S3DIS_CLASSES)
    counts = torch.bincount(labels, minlength=13)
    assert all(counts[c] > 0 for c in (0, 1, 2, 6, 7, 8))  # ceiling, floor, wall, door, table, chair


def test_floor_and_ceiling_lie_at_the_room_bottom_and_top(rooms):
    for block in rooms["train"][:10]:
        z, y = block.x[:, 2], block.y
        assert torch.allclose(z[y == 1], torch.zeros(int((y == 1).sum())), atol=1e-6)
        if bool((y == 0).any()):
            assert torch.allclose(block.x[y == 0, 8], torch.ones(int((y == 0).sum())), atol=1e-5)


def test_deterministic_and_area_5_held_out(rooms):
    again = synthetic_rooms(rooms_per_area=1, seed=2, k=4, num_points=128, val_blocks=5)
    assert all(torch.equal(a.x, b.x) for a, b in zip(rooms["test"], again["test"], strict=True))
    area5 = synthetic_rooms(rooms_per_area=1, seed=2, k=4, num_points=128, test_area=5, val_blocks=5)
    assert all(int(block.area) == 5 for block in area5["test"])
    total = sum(len(v) for v in rooms.values())
    assert sum(len(v) for v in area5.values()) == total
    with pytest.raises(ValueError, match="test_area"):
        synthetic_rooms(rooms_per_area=1, test_area=0)
    with pytest.raises(ValueError, match="rooms_per_area"):
        synthetic_rooms(rooms_per_area=0)


def test_data_info_prints_blocks_and_class_counts(capsys):
    args = ["data", "info", "synthetic_rooms", "--set", "rooms_per_area=1", "--set", "num_points=64",
            "--set", "k=4", "--set", "val_blocks=3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "val_graphs: 3" in out and "classes: 13" in out and "class_sizes:" in out
    sizes = out.split("class_sizes: ")[1].splitlines()[0]
    assert sum(map(int, sizes.strip("[]").split(","))) == int(out.split("\nnodes: ")[1].split()[0])
