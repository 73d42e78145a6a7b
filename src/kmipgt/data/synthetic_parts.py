"""Synthetic part segmentation at ShapeNet-Part's scale: shapes of four categories built from primitives.

Each shape is a table, lamp, chair or rocket assembled from boxes, cylinders, spheres and rectangles
(:mod:`kmipgt.data.primitives`) with random proportions, turned about the vertical axis, centred and scaled
into the unit ball, and surface-sampled to 2,048 points with normals. Every point is labelled with its part.
The same primitive is a different part in different categories (a cylinder is a table's or chair's leg, a
lamp's base or stem, a rocket's body), so a point's label needs the whole shape, not its neighbourhood.
Part ids are contiguous per category, as in ShapeNet-Part.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from kmipgt.data.point_cloud import knn_graph
from kmipgt.data.primitives import Box, Cylinder, Primitive, Rectangle, Sphere, sample_surfaces

__all__ = ["SYNTHETIC_PART_CATEGORIES", "category_parts", "synthetic_part_shape", "synthetic_parts"]

# category -> its part names; part ids run through the categories in this order
SYNTHETIC_PART_CATEGORIES: dict[str, tuple[str, ...]] = {
    "table": ("top", "leg"),
    "lamp": ("base", "stem", "shade"),
    "chair": ("seat", "back", "leg"),
    "rocket": ("body", "nose", "fin"),
}
# ShapeNet-Part's official train / val / test shape counts (16,881 shapes)
SHAPENET_PART_SPLIT = (12137, 1870, 2874)


def category_parts() -> list[list[int]]:
    """The part ids of each category, in :data:`SYNTHETIC_PART_CATEGORIES` order."""
    parts, first = [], 0
    for names in SYNTHETIC_PART_CATEGORIES.values():
        parts.append(list(range(first, first + len(names))))
        first += len(names)
    return parts


def _legs(x: float, y: float, height: float, radius: float, part: int) -> list[tuple[Primitive, int]]:
    """Four vertical legs of ``height`` from the floor at ``(±x, ±y)``, all labelled ``part``."""
    return [
        (Cylinder((sx * x, sy * y, height / 2), radius, height / 2), part) for sx in (-1, 1) for sy in (-1, 1)
    ]


def _table(rng: np.random.Generator, part: list[int]) -> list[tuple[Primitive, int]]:
    width, depth, height = rng.uniform(0.6, 1.2), rng.uniform(0.4, 0.8), rng.uniform(0.5, 0.9)
    radius = rng.uniform(0.03, 0.06)
    top = (Box((0, 0, height), (width, depth, 0.03)), part[0])
    return [top, *_legs(width - 0.1, depth - 0.1, height, radius, part[1])]


def _lamp(rng: np.random.Generator, part: list[int]) -> list[tuple[Primitive, int]]:
    base_r, stem_h, shade_r = rng.uniform(0.2, 0.35), rng.uniform(0.6, 1.2), rng.uniform(0.2, 0.4)
    return [
        (Cylinder((0, 0, 0.03), base_r, 0.03), part[0]),
        (Cylinder((0, 0, 0.06 + stem_h / 2), rng.uniform(0.02, 0.05), stem_h / 2), part[1]),
        (Sphere((0, 0, 0.06 + stem_h + 0.7 * shade_r), shade_r), part[2]),
    ]


def _chair(rng: np.random.Generator, part: list[int]) -> list[tuple[Primitive, int]]:
    half, seat_h, back_h = rng.uniform(0.25, 0.4), rng.uniform(0.35, 0.5), rng.uniform(0.3, 0.6)
    radius = rng.uniform(0.02, 0.04)
    back = Rectangle((0, -half, seat_h + back_h), (1, 0, 0), (0, 0, 1), half, back_h)
    seat = Box((0, 0, seat_h), (half, half, 0.03))
    return [(seat, part[0]), (back, part[1]), *_legs(half - 0.05, half - 0.05, seat_h, radius, part[2])]


def _rocket(rng: np.random.Generator, part: list[int]) -> list[tuple[Primitive, int]]:
    radius, length = rng.uniform(0.1, 0.2), rng.uniform(0.8, 1.4)
    fin = rng.uniform(0.1, 0.25)
    shapes: list[tuple[Primitive, int]] = [
        (Cylinder((0, 0, length / 2), radius, length / 2), part[0]),
        (Sphere((0, 0, length), radius), part[1]),
    ]
    count = int(rng.integers(3, 5))
    for angle in np.arange(count) * 2 * np.pi / count:
        out = (np.cos(angle), np.sin(angle), 0.0)
        centre = (out[0] * (radius + fin), out[1] * (radius + fin), fin)
        shapes.append((Rectangle(centre, out, (0, 0, 1), fin, fin), part[2]))
    return shapes


_BUILDERS = (_table, _lamp, _chair, _rocket)


def _rotate_z(points: np.ndarray, angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return points @ np.array([[c, s, 0.0], [-s, c, 0.0], [0.0, 0.0, 1.0]])


def synthetic_part_shape(
    category: int, rng: np.random.Generator, num_points: int = 2048
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One shape of ``category`` (index into :data:`SYNTHETIC_PART_CATEGORIES`) drawn from ``rng``.

    Returns ``points [n, 3]`` (centred, in the unit ball), unit ``normals [n, 3]`` and int64 part ids
    ``[n]``, ``n = num_points``.
    """
    if not 0 <= category < len(_BUILDERS):
        raise ValueError(f"category must be in [0, {len(_BUILDERS)}), got {category}")
    points, normals, labels = sample_surfaces(rng, _BUILDERS[category](rng, category_parts()[category]),
                                              num_points)
    angle = rng.uniform(0.0, 2.0 * np.pi)
    points, normals = _rotate_z(points, angle), _rotate_z(normals, angle)
    points -= points.mean(0)
    points /= np.linalg.norm(points, axis=1).max()
    return points, normals, labels


def _split_sizes(num_shapes: int) -> tuple[int, int, int]:
    total = sum(SHAPENET_PART_SPLIT)
    val = max(1, round(num_shapes * SHAPENET_PART_SPLIT[1] / total))
    test = max(1, round(num_shapes * SHAPENET_PART_SPLIT[2] / total))
    return num_shapes - val - test, val, test


def synthetic_parts(
    num_shapes: int = sum(SHAPENET_PART_SPLIT),
    seed: int = 0,
    k: int = 8,
    num_points: int = 2048,
    symmetric: bool = False,
) -> dict[str, list[Data]]:
    """``num_shapes`` synthetic shapes split in ShapeNet-Part's proportions (default: its 16,881 shapes).

    Args:
        num_shapes: shapes in all (at least 3: one per split).
        seed: shape ``i`` (its category too) is drawn from ``numpy.random.default_rng([seed, i])``.
        k: neighbours of each point's kNN graph (:func:`knn_graph`; 8 as the paper's ShapeNet-Part runs).
        num_points: points per shape (2,048, as the usual ShapeNet-Part sampling).
        symmetric: symmetrise each kNN graph (default directed, as the paper).

    Returns:
        ``{"train", "val", "test"}`` lists of ``Data`` with ``x [n, 6]`` (normals then position, as the
        paper's features), ``pos [n, 3]``, ``y [n]`` part ids, ``category [1]`` and ``edge_index``. The
        full set holds about 16,881 x 2,048 x (9 floats + 16 int64 edge ids) = 5 GB.
    """
    if not isinstance(num_shapes, int) or num_shapes < 3:
        raise ValueError(f"num_shapes must be an int >= 3, got {num_shapes!r}")
    if not isinstance(num_points, int) or num_points <= k:
        raise ValueError(f"num_points must be an int larger than k={k}, got {num_points!r}")
    sizes = _split_sizes(num_shapes)
    graphs = []
    for index in range(num_shapes):
        rng = np.random.default_rng([seed, index])
        category = int(rng.integers(len(_BUILDERS)))
        points, normals, labels = synthetic_part_shape(category, rng, num_points)
        pos = torch.from_numpy(points).float()
        graphs.append(Data(
            x=torch.cat([torch.from_numpy(normals).float(), pos], 1),
            pos=pos,
            y=torch.from_numpy(labels),
            category=torch.tensor([category]),
            edge_index=knn_graph(pos, k, symmetric=symmetric),
        ))
    bounds = np.cumsum((0, *sizes))
    return {split: graphs[bounds[i]:bounds[i + 1]] for i, split in enumerate(("train", "val", "test"))}
