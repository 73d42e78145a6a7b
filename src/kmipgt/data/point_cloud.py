"""k-nearest-neighbour graphs over point clouds: one transductive kNN graph, or the kNN graphs of a batch of
shapes for inductive point-cloud segmentation."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import torch
from torch_geometric.data import Data

from kmipgt.data.road_graph import symmetric_edges
from kmipgt.data.splits import random_split_masks


def knn_graph(
    pos: torch.Tensor | np.ndarray,
    k: int,
    batch: torch.Tensor | np.ndarray | None = None,
    *,
    symmetric: bool = False,
) -> torch.Tensor:
    """The k-nearest-neighbour graph of each point cloud of a batch, by Euclidean distance (scipy's cKDTree).

    PyG's ``knn_graph`` needs torch-cluster, which has no wheel for every torch; one KD-tree per cloud
    does the same search on the CPU.

    Args:
        pos: ``[N, D]`` point coordinates.
        k: neighbours per point, ``1 <= k < n`` for every cloud of ``n`` points.
        batch: ``[N]`` cloud index of each point, sorted (as PyG's ``Batch.batch``); None: one cloud.
        symmetric: also add the reverse of every edge (each pair once per direction).

    Returns:
        ``edge_index [2, E]`` int64 on ``pos``'s device. Directed (default): the ``k`` edges ``j -> i`` from
        the nearest other points ``j`` of each point ``i`` into ``i`` (``edge_index[1]`` is ``i``), so
        ``E = N * k``, grouped by ``i`` and ordered by distance. ``symmetric``: the union of both
        directions, sorted, so every point has at least ``k`` in-edges. No self-loops either way; a
        duplicate of ``i`` at distance 0 is a neighbour like any other point. Ties at the ``k``-th
        distance are broken as the KD-tree returns them: which of equally distant points is kept is
        unspecified, the kept distances are always the ``k`` smallest.
    """
    device = pos.device if isinstance(pos, torch.Tensor) else torch.device("cpu")
    points = (pos.detach().cpu().numpy() if isinstance(pos, torch.Tensor) else np.asarray(pos)).astype(
        np.float64
    )
    if points.ndim != 2 or points.shape[0] == 0:
        raise ValueError(f"pos must have shape [N, D] with N >= 1, got {points.shape}")
    if not isinstance(k, int | np.integer) or isinstance(k, bool) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    num_points = points.shape[0]
    if batch is None:
        starts = np.array([0, num_points])
    else:
        ids = batch.cpu().numpy() if isinstance(batch, torch.Tensor) else np.asarray(batch)
        if ids.shape != (num_points,):
            raise ValueError(f"batch must have shape [{num_points}], got {ids.shape}")
        if np.any(np.diff(ids) < 0):
            raise ValueError("batch must be sorted (the points of each cloud contiguous)")
        starts = np.flatnonzero(np.r_[True, np.diff(ids) != 0, True])
    from scipy.spatial import cKDTree

    sources, targets = [], []
    for start, stop in pairwise(starts):
        size = stop - start
        if k >= size:
            raise ValueError(f"k must be smaller than every cloud's point count, got k={k} for {size} points")
        cloud = points[start:stop]
        _, nearest = cKDTree(cloud).query(cloud, k=k + 1)
        centre = np.arange(size)[:, None]
        # Drop each point itself; among coincident points it may come after a duplicate, or not at all
        # (k + 1 coincident points), in which case the farthest of the k + 1 goes.
        is_self = nearest == centre
        drop = np.where(is_self.any(1), is_self.argmax(1), k)
        keep = np.ones_like(nearest, dtype=bool)
        keep[np.arange(size), drop] = False
        sources.append(nearest[keep].reshape(size, k).ravel() + start)
        targets.append(np.repeat(np.arange(size), k) + start)
    edge_index = torch.from_numpy(np.stack([np.concatenate(sources), np.concatenate(targets)])).long()
    if symmetric:
        edge_index, _ = symmetric_edges(edge_index, num_points)
    return edge_index.to(device)


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
