"""synthetic_parts: primitives' surfaces and normals, labels per part, determinism, splits, data info."""

import numpy as np
import pytest
import torch

from kmipgt.cli import main
from kmipgt.data.primitives import Box, Cylinder, Rectangle, Sphere, sample_surfaces
from kmipgt.data.synthetic_parts import SYNTHETIC_PART_CATEGORIES, category_parts, synthetic_parts


def test_primitive_points_lie_on_their_surfaces_with_unit_outward_normals():
    rng = np.random.default_rng(0)
    points, normals = Sphere((1, 2, 3), 0.5).sample(rng, 500)
    assert np.allclose(np.linalg.norm(points - (1, 2, 3), axis=1), 0.5)
    assert np.allclose(normals, (points - (1, 2, 3)) / 0.5)
    points, normals = Box((0, 0, 0), (1, 2, 3)).sample(rng, 500)
    on_face = np.isclose(np.abs(points), (1, 2, 3)).any(1)
    assert on_face.all() and np.allclose(np.abs(normals).sum(1), 1)
    assert np.all((points * normals).sum(1) > 0)  # outward
    points, normals = Cylinder((0, 0, 1), 0.5, 1.0).sample(rng, 2000)
    side = np.isclose(normals[:, 2], 0)
    assert np.allclose(np.linalg.norm(points[side, :2], axis=1), 0.5)
    assert np.allclose(np.abs(points[~side, 2] - 1), 1.0)
    assert np.all(np.linalg.norm(points[:, :2], axis=1) <= 0.5 + 1e-9)
    # caps hold their share of the area: 2 pi r^2 / (2 pi r (2h + r)) = 0.2
    assert abs((~side).mean() - 0.2) < 0.03
    points, normals = Rectangle((0, 0, 0), (1, 0, 0), (0, 1, 0), 2, 1).sample(rng, 300)
    assert np.allclose(points[:, 2], 0) and np.allclose(normals, (0, 0, 1))
    assert np.all(np.abs(points[:, 0]) <= 2) and np.all(np.abs(points[:, 1]) <= 1)


def test_points_are_shared_out_by_area():
    rng = np.random.default_rng(1)
    _, _, labels = sample_surfaces(rng, [(Sphere((0, 0, 0), 1.0), 0), (Sphere((5, 0, 0), 2.0), 1)], 20000)
    assert labels.shape == (20000,) and abs((labels == 1).mean() - 0.8) < 0.02


def test_shapes_are_labelled_by_their_category_parts_and_deterministic():
    data = synthetic_parts(num_shapes=12, seed=3, k=4, num_points=256)
    assert [len(data[s]) for s in ("train", "val", "test")] == [9, 1, 2]
    parts = category_parts()
    assert sum(map(len, parts)) == sum(len(p) for p in SYNTHETIC_PART_CATEGORIES.values())
    for graph in (g for split in data.values() for g in split):
        assert graph.x.shape == (256, 6) and graph.y.shape == (256,)
        assert torch.equal(graph.x[:, 3:], graph.pos)
        assert torch.allclose(graph.x[:, :3].norm(dim=1), torch.ones(256), atol=1e-5)
        assert float(graph.pos.norm(dim=1).max()) == pytest.approx(1.0, abs=1e-5)
        assert set(graph.y.tolist()) <= set(parts[int(graph.category)])
        assert graph.edge_index.shape == (2, 256 * 4)
    again = synthetic_parts(num_shapes=12, seed=3, k=4, num_points=256)
    assert all(torch.equal(a.x, b.x) and torch.equal(a.y, b.y) for a, b in zip(data["test"], again["test"],
                                                                                 strict=True))
    other = synthetic_parts(num_shapes=12, seed=4, k=4, num_points=256)
    assert not torch.equal(data["train"][0].x, other["train"][0].x)


def test_a_cylinder_is_a_different_part_in_different_categories():
    # legs of tables and chairs, a lamp's base and stem and a rocket's body are all cylinders
    names = [f"{c}.{p}" for c, ps in SYNTHETIC_PART_CATEGORIES.items() for p in ps]
    assert {"table.leg", "chair.leg", "lamp.stem", "rocket.body"} <= set(names)


def test_bad_options():
    with pytest.raises(ValueError, match="num_shapes"):
        synthetic_parts(num_shapes=2)
    with pytest.raises(ValueError, match="num_points"):
        synthetic_parts(num_shapes=3, num_points=8, k=8)


def test_data_info_prints_sizes_and_class_counts(capsys):
    assert main(["data", "info", "synthetic_parts", "--set", "num_shapes=6", "--set", "num_points=64"]) == 0
    out = capsys.readouterr().out
    assert "graphs: 6" in out and "train_graphs: 4" in out and "nodes: 384" in out
    assert "classes:" in out and "class_sizes:" in out and "graphs_per_category:" in out
