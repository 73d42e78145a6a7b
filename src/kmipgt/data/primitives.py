"""Points sampled uniformly on the surfaces of boxes, cylinders, spheres and rectangles, with normals.

The building blocks of the synthetic point-cloud sets: each primitive knows its surface area (so a shape's
points are shared out by area) and draws ``n`` points with their outward unit normals.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Box", "Cylinder", "Primitive", "Rectangle", "Sphere", "sample_surfaces"]


def _faces(rng: np.random.Generator, n: int, areas: np.ndarray) -> np.ndarray:
    """``[n]`` face index of each point, drawn in proportion to the faces' areas."""
    return rng.choice(len(areas), size=n, p=areas / areas.sum())


@dataclass(frozen=True)
class Box:
    """Axis-aligned box: ``centre [3]``, ``half [3]`` half-extents."""

    centre: tuple[float, float, float]
    half: tuple[float, float, float]

    def area(self) -> float:
        hx, hy, hz = self.half
        return 8.0 * (hy * hz + hx * hz + hx * hy)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        half = np.asarray(self.half, dtype=np.float64)
        pair_areas = np.array([half[1] * half[2], half[0] * half[2], half[0] * half[1]])
        face = _faces(rng, n, np.repeat(pair_areas, 2))  # faces -x, +x, -y, +y, -z, +z
        axis, sign = face // 2, np.where(face % 2 == 0, -1.0, 1.0)
        unit = rng.uniform(-1.0, 1.0, size=(n, 3))
        unit[np.arange(n), axis] = sign
        normals = np.zeros((n, 3))
        normals[np.arange(n), axis] = sign
        return np.asarray(self.centre) + unit * half, normals


@dataclass(frozen=True)
class Cylinder:
    """Closed cylinder along z: ``centre [3]``, ``radius``, ``half_height``."""

    centre: tuple[float, float, float]
    radius: float
    half_height: float

    def area(self) -> float:
        return 2.0 * np.pi * self.radius * (2.0 * self.half_height + self.radius)

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        r, h = self.radius, self.half_height
        face = _faces(rng, n, np.array([4.0 * np.pi * r * h, np.pi * r * r, np.pi * r * r]))
        angle = rng.uniform(0.0, 2.0 * np.pi, n)
        radial = np.stack([np.cos(angle), np.sin(angle), np.zeros(n)], 1)
        # sqrt: uniform over the disc's area, not its radius
        cap_radius = r * np.sqrt(rng.uniform(0.0, 1.0, n))
        side = face == 0
        z = np.where(side, rng.uniform(-h, h, n), np.where(face == 1, -h, h))
        rho = np.where(side, r, cap_radius)
        points = radial * rho[:, None]
        points[:, 2] = z
        normals = np.where(side[:, None], radial, 0.0)
        normals[:, 2] = np.where(side, 0.0, np.where(face == 1, -1.0, 1.0))
        return np.asarray(self.centre) + points, normals


@dataclass(frozen=True)
class Sphere:
    """Sphere: ``centre [3]``, ``radius``."""

    centre: tuple[float, float, float]
    radius: float

    def area(self) -> float:
        return 4.0 * np.pi * self.radius**2

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        normals = rng.normal(size=(n, 3))
        normals /= np.linalg.norm(normals, axis=1, keepdims=True)
        return np.asarray(self.centre) + self.radius * normals, normals


@dataclass(frozen=True)
class Rectangle:
    """A flat rectangle (a plane patch): ``centre [3]``, unit in-plane axes ``u``, ``v`` (orthogonal) and
    half-sizes along them; its normal is ``u x v``."""

    centre: tuple[float, float, float]
    u: tuple[float, float, float]
    v: tuple[float, float, float]
    half_u: float
    half_v: float

    def area(self) -> float:
        return 4.0 * self.half_u * self.half_v

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        u, v = np.asarray(self.u, dtype=np.float64), np.asarray(self.v, dtype=np.float64)
        a = rng.uniform(-self.half_u, self.half_u, (n, 1))
        b = rng.uniform(-self.half_v, self.half_v, (n, 1))
        normal = np.cross(u, v)
        return np.asarray(self.centre) + a * u + b * v, np.tile(normal, (n, 1))


Primitive = Box | Cylinder | Sphere | Rectangle


def sample_surfaces(
    rng: np.random.Generator, parts: list[tuple[Primitive, int]], num_points: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``num_points`` points over the union of ``parts`` (``(primitive, label)`` pairs), shared out by area.

    Returns ``points [n, 3]``, unit ``normals [n, 3]`` and int64 ``labels [n]``, in the order of ``parts``.
    """
    areas = np.array([primitive.area() for primitive, _ in parts])
    counts = rng.multinomial(num_points, areas / areas.sum())
    points, normals, labels = [], [], []
    for (primitive, label), count in zip(parts, counts, strict=True):
        p, q = primitive.sample(rng, int(count))
        points.append(p)
        normals.append(q)
        labels.append(np.full(int(count), label, dtype=np.int64))
    return np.concatenate(points), np.concatenate(normals), np.concatenate(labels)
