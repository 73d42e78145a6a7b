"""k-nearest-neighbour graphs over point clouds, for point-cloud segmentation style node classification."""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data

from kmipgt.data.road_graph import symmetric_edges
from kmipgt.data.splits import random_split_masks


def knn_graph_dataset(
    points: torch.Tensor | np.ndarray,
    features: torch.Tensor | np.ndarray | None,
    labels: torch.Tensor | np.ndarray | None,
    k: int,
    *,
    train_fraction: float = 0.1,
    val_fraction: float = 0.1,
    seed: int = 0,
) -> Data:
    """A symmetric kNN graph over ``points`` as a node-classification ``Data``.

    Args:
        points: ``[N, D]`` coordinates; neighbours by Euclidean distance (scikit-learn ``NearestNeighbors``).
        features: ``[N, F]`` node features, or None to use the points.
        labels: ``[N]`` integer node labels, or None.
        k: neighbours per point (``1 <= k < N``); each point links to its ``k`` nearest others and the edge
            set is symmetrised, so degrees are at least ``k``.
        train_fraction, val_fraction, seed: random split as :func:`random_split_masks`.

    Returns:
        ``Data`` with ``x`` float32 ``[N, F]``, ``pos`` float32 ``[N, D]``, ``edge_index [2, E]`` (both
        directions, no self-loops), ``y`` int64 ``[N]`` when labels are given, and boolean masks.
    """
    points = np.asarray(points, dtype=np.float64)
    if points.ndim != 2 or points.shape[0] < 2:
        raise ValueError(f"points must have shape [N, D] with N >= 2, got {points.shape}")
    num_points = points.shape[0]
    if not isinstance(k, int | np.integer) or not 1 <= k < num_points:
        raise ValueError(f"k must be an int in [1, {num_points - 1}], got {k!r}")
    x = torch.as_tensor(points if features is None else np.asarray(features), dtype=torch.float32)
    if x.dim() != 2 or x.size(0) != num_points:
        raise ValueError(f"features must have shape [{num_points}, F], got {tuple(x.shape)}")
    from sklearn.neighbors import NearestNeighbors  # imported here: sklearn is slow to import

    # Ask for k + 1 and drop each point itself; with duplicate points "itself" may come second, so drop by id.
    neighbours = NearestNeighbors(n_neighbors=k + 1).fit(points).kneighbors(points, return_distance=False)
    centre = np.repeat(np.arange(num_points), k + 1)
    others = neighbours.ravel()
    keep = others != centre
    edge_index = torch.from_numpy(np.stack([others[keep], centre[keep]]))
    edge_index, _ = symmetric_edges(edge_index, num_points)
    data = Data(x=x, pos=torch.from_numpy(points).float(), edge_index=edge_index, num_nodes=num_points)
    if labels is not None:
        y = torch.as_tensor(np.asarray(labels)).long().view(-1)
        if y.numel() != num_points:
            raise ValueError(f"labels must have shape [{num_points}], got {tuple(y.shape)}")
        data.y = y
    data.train_mask, data.val_mask, data.test_mask = random_split_masks(
        num_points, train_fraction, val_fraction, seed
    )
    return data


def digits_knn(k: int = 10) -> Data:
    """scikit-learn's bundled handwritten digits (1,797 8x8 images, 10 classes) as a kNN graph.

    Each image is a point in the 64-d pixel space (intensities / 16); features are the same pixels, labels
    the digits. A small real graph whose labels need only local information. Data: UCI optical digits,
    shipped inside scikit-learn (BSD-3).
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = digits.data / 16.0
    data = knn_graph_dataset(pixels, pixels, digits.target, k)
    data.name = "digits"
    return data
