"""Synthetic indoor scenes in S3DIS's form: rooms of 6 areas cut into 1 m x 1 m blocks of 4,096 points.

Each room is a box of floor, ceiling and walls, with beams, columns, windows, a door, tables, chairs, a
sofa, bookcases, a board and clutter built from :mod:`kmipgt.data.primitives` at random places, surface-
sampled by area and coloured per class (a room-wide tint and per-point noise on top). As PointNet cut
S3DIS, the room's floor plan is split into 1 m x 1 m columns of full height and each column sampled to
4,096 points (with repeats where it holds fewer). The 13 classes are S3DIS's
(:data:`kmipgt.data.s3dis.S3DIS_CLASSES`), and so are the 9 feature columns: xyz centred on the block's
floor-plan centre, rgb in [0, 1], xyz divided by the room's extent.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from kmipgt.data.point_cloud import knn_graph
from kmipgt.data.primitives import Box, Cylinder, Primitive, Rectangle, Sphere, sample_surfaces
from kmipgt.data.s3dis import split_by_area

__all__ = ["synthetic_rooms"]

CEILING, FLOOR, WALL, BEAM, COLUMN, WINDOW, DOOR, TABLE, CHAIR, SOFA, BOOKCASE, BOARD, CLUTTER = range(13)
# a base colour per class of S3DIS_CLASSES, rgb in [0, 1]
_COLOURS = np.array([
    (0.9, 0.9, 0.85), (0.55, 0.45, 0.35), (0.8, 0.8, 0.75), (0.7, 0.7, 0.7), (0.75, 0.72, 0.7),
    (0.6, 0.75, 0.9), (0.5, 0.35, 0.2), (0.6, 0.45, 0.3), (0.2, 0.2, 0.25), (0.4, 0.2, 0.2),
    (0.5, 0.4, 0.3), (0.95, 0.95, 0.95), (0.5, 0.5, 0.5),
])
_INSET = 0.02  # windows, doors and boards sit this far in front of their wall


def _table_parts(x: float, y: float, rng: np.random.Generator) -> list[tuple[Primitive, int]]:
    half_x, half_y, height = rng.uniform(0.4, 1.0), rng.uniform(0.3, 0.6), rng.uniform(0.7, 0.8)
    parts: list[tuple[Primitive, int]] = [(Box((x, y, height), (half_x, half_y, 0.02)), TABLE)]
    for sx in (-1, 1):
        for sy in (-1, 1):
            parts.append((Cylinder((x + sx * (half_x - 0.05), y + sy * (half_y - 0.05), height / 2), 0.03,
                                   height / 2), TABLE))
    return parts


def _chair_parts(x: float, y: float, rng: np.random.Generator) -> list[tuple[Primitive, int]]:
    half, seat = 0.22, rng.uniform(0.42, 0.48)
    parts: list[tuple[Primitive, int]] = [
        (Box((x, y, seat), (half, half, 0.03)), CHAIR),
        (Rectangle((x, y - half, seat + 0.25), (1, 0, 0), (0, 0, 1), half, 0.25), CHAIR),
    ]
    for sx in (-1, 1):
        for sy in (-1, 1):
            parts.append((Cylinder((x + sx * (half - 0.03), y + sy * (half - 0.03), seat / 2), 0.015,
                                   seat / 2), CHAIR))
    return parts


def _room_parts(
    rng: np.random.Generator, length: float, width: float, height: float
) -> list[tuple[Primitive, int]]:
    """The primitives of one room spanning ``[0, length] x [0, width] x [0, height]``, with their classes."""
    L, W, H = length, width, height
    parts: list[tuple[Primitive, int]] = [
        (Rectangle((L / 2, W / 2, 0), (1, 0, 0), (0, 1, 0), L / 2, W / 2), FLOOR),
        (Rectangle((L / 2, W / 2, H), (0, 1, 0), (1, 0, 0), W / 2, L / 2), CEILING),
        (Rectangle((L / 2, 0, H / 2), (1, 0, 0), (0, 0, 1), L / 2, H / 2), WALL),
        (Rectangle((L / 2, W, H / 2), (0, 0, 1), (1, 0, 0), H / 2, L / 2), WALL),
        (Rectangle((0, W / 2, H / 2), (0, 0, 1), (0, 1, 0), H / 2, W / 2), WALL),
        (Rectangle((L, W / 2, H / 2), (0, 1, 0), (0, 0, 1), W / 2, H / 2), WALL),
        (Rectangle((_INSET, rng.uniform(0.6, W - 0.6), 1.05), (0, 0, 1), (0, 1, 0), 1.05, 0.45), DOOR),
    ]
    for _ in range(int(rng.integers(0, 3))):
        y = rng.uniform(0.2, W - 0.2)
        parts.append((Box((L / 2, y, H - 0.15), (L / 2, 0.15, 0.15)), BEAM))
    for _ in range(int(rng.integers(0, 3))):
        y = rng.uniform(0.3, W - 0.3)
        parts.append((Box((0.25, y, H / 2), (0.25, 0.25, H / 2)), COLUMN))
    for _ in range(int(rng.integers(0, 3))):
        x = rng.uniform(1.0, L - 1.0)
        window = Rectangle((x, W - _INSET, 1.7), (0, 0, 1), (1, 0, 0), 0.6, rng.uniform(0.4, 0.9))
        parts.append((window, WINDOW))
    if rng.random() < 0.7:
        parts.append((Rectangle((L - _INSET, W / 2, 1.5), (0, 1, 0), (0, 0, 1), min(1.2, W / 2 - 0.2), 0.6),
                      BOARD))
    for _ in range(int(rng.integers(1, 4))):
        x, y = rng.uniform(1.2, L - 1.2), rng.uniform(1.0, W - 1.0)
        parts += _table_parts(x, y, rng)
        for _ in range(int(rng.integers(0, 4))):
            parts.append((Sphere((x + rng.uniform(-0.3, 0.3), y + rng.uniform(-0.2, 0.2), 0.85),
                                 rng.uniform(0.04, 0.1)), CLUTTER))
    for _ in range(int(rng.integers(2, 7))):
        parts += _chair_parts(rng.uniform(0.5, L - 0.5), rng.uniform(0.5, W - 0.5), rng)
    if rng.random() < 0.5:
        parts.append((Box((rng.uniform(1.2, L - 1.2), 0.5, 0.25), (1.0, 0.45, 0.25)), SOFA))
    for _ in range(int(rng.integers(0, 3))):
        parts.append((Box((rng.uniform(0.8, L - 0.8), W - 0.22, 1.0), (0.5, 0.2, 1.0)), BOOKCASE))
    for _ in range(int(rng.integers(2, 8))):  # boxes standing on the floor
        half = rng.uniform(0.05, 0.2, 3)
        parts.append((Box((rng.uniform(0.3, L - 0.3), rng.uniform(0.3, W - 0.3), half[2]), tuple(half)),
                       CLUTTER))
    return parts


def _room_blocks(rng: np.random.Generator, num_points: int, k: int, symmetric: bool) -> list[Data]:
    """One room's 1 m x 1 m blocks, each ``num_points`` points."""
    L, W, H = rng.uniform(4.0, 9.0), rng.uniform(4.0, 7.0), rng.uniform(2.8, 3.4)
    parts = _room_parts(rng, L, W, H)
    # num_points / 2 points per square metre: a block's column holds at least floor and ceiling, 2 m^2
    area = sum(primitive.area() for primitive, _ in parts)
    points, _, labels = sample_surfaces(rng, parts, int(area * num_points / 2))
    tint = rng.normal(0.0, 0.05, 3)
    rgb = np.clip(_COLOURS[labels] + tint + rng.normal(0.0, 0.03, (len(labels), 3)), 0.0, 1.0)
    extent = np.array([L, W, H])
    blocks = []
    cell = np.floor(points[:, :2]).astype(np.int64)
    for bx in range(int(np.ceil(L))):
        for by in range(int(np.ceil(W))):
            inside = np.flatnonzero((cell[:, 0] == bx) & (cell[:, 1] == by))
            if inside.size < 100:  # slivers at the room's far edges, as PointNet drops
                continue
            pick = rng.choice(inside, size=num_points, replace=inside.size < num_points)
            xyz = points[pick]
            centred = xyz - np.array([bx + 0.5, by + 0.5, 0.0])
            x = torch.from_numpy(np.concatenate([centred, rgb[pick], xyz / extent], 1)).float()
            pos = x[:, :3].clone()
            blocks.append(Data(x=x, pos=pos, y=torch.from_numpy(labels[pick]),
                               edge_index=knn_graph(pos, k, symmetric=symmetric)))
    return blocks


def synthetic_rooms(
    rooms_per_area: int = 4, seed: int = 0, test_area: int = 6, k: int = 32, num_points: int = 4096,
    symmetric: bool = False, val_blocks: int | None = None,
) -> dict[str, list[Data]]:
    """Synthetic rooms over 6 areas in S3DIS's block form (module docstring), split by area as S3DIS.

    Args:
        rooms_per_area: rooms in each of the 6 areas (4 to 9 m by 4 to 7 m: about 20 to 60 blocks each).
        seed: room ``r`` of area ``a`` is drawn from ``numpy.random.default_rng([seed, a, r])``.
        test_area, val_blocks: the split, as :func:`kmipgt.data.s3dis` (``val_blocks`` drawn with ``seed``).
        k: neighbours of each block's kNN graph (32 as the paper's S3DIS runs).
        num_points: points per block (4,096 as PointNet's blocks).
        symmetric: symmetrise the kNN graphs (default directed).

    Returns:
        ``{"train", "val", "test"}`` lists of ``Data``: ``x [num_points, 9]``, ``pos``, ``y`` S3DIS's 13
        classes, ``area [1]`` and ``edge_index``. Every block is held in memory, its kNN
        edges included (``num_points * k`` int64 pairs: 2 MiB a block at the defaults).
    """
    if not isinstance(rooms_per_area, int) or rooms_per_area < 1:
        raise ValueError(f"rooms_per_area must be a positive int, got {rooms_per_area!r}")
    if not isinstance(test_area, int) or not 1 <= test_area <= 6:
        raise ValueError(f"test_area must be an int in 1..6, got {test_area!r}")
    if not isinstance(num_points, int) or num_points <= k:
        raise ValueError(f"num_points must be an int larger than k={k}, got {num_points!r}")
    blocks, areas = [], []
    for area in range(1, 7):
        for room in range(rooms_per_area):
            for block in _room_blocks(np.random.default_rng([seed, area, room]), num_points, k, symmetric):
                block.area = torch.tensor([area])
                blocks.append(block)
                areas.append(area)
    return split_by_area(blocks, areas, test_area, val_blocks, seed)

