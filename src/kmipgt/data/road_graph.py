"""Shared construction of road-network ``Data`` objects: metre lengths, symmetric edges, labels and masks.

Every road network in :mod:`kmipgt.data` (Minnesota, Helsinki, synthetic cities, City-Networks copies) is a
PyG ``Data`` with ``x``, ``edge_index`` (both directions, no self-loops, no duplicates), ``edge_length``
(float64 metres, one per ``edge_index`` column), ``eccentricity`` (float64 metres, per node), ``y`` and
boolean ``train_mask``/``val_mask``/``test_mask``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.utils import remove_self_loops, scatter, to_undirected

from kmipgt.data.city_labels import eccentricity_labels
from kmipgt.data.splits import random_split_masks

EARTH_RADIUS_M = 6_371_008.8  # mean Earth radius (IUGG), metres


def haversine_metres(lonlat_a: np.ndarray, lonlat_b: np.ndarray) -> np.ndarray:
    """Great-circle distance in metres between ``[..., 2]`` (longitude, latitude) points in degrees."""
    lon_a, lat_a = np.radians(lonlat_a[..., 0]), np.radians(lonlat_a[..., 1])
    lon_b, lat_b = np.radians(lonlat_b[..., 0]), np.radians(lonlat_b[..., 1])
    h = np.sin((lat_b - lat_a) / 2) ** 2 + np.cos(lat_a) * np.cos(lat_b) * np.sin((lon_b - lon_a) / 2) ** 2
    return 2 * EARTH_RADIUS_M * np.arcsin(np.sqrt(np.clip(h, 0.0, 1.0)))


def symmetric_edges(
    edge_index: torch.Tensor, num_nodes: int, edge_length: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Both directions of every edge, self-loops removed, sorted; parallel edges keep their shortest length.

    Returns ``edge_index [2, E']`` and, if given, ``edge_length [E']`` (float64).
    """
    length = None if edge_length is None else edge_length.to(torch.float64)
    # PyG's to_undirected keeps self-loops, which a road network must not have (a road joins two junctions)
    edge_index, length = remove_self_loops(torch.as_tensor(edge_index, dtype=torch.long), length)
    return to_undirected(edge_index, length, num_nodes, reduce="min")


def degree_and_mean_length(
    edge_index: torch.Tensor, edge_length: torch.Tensor, num_nodes: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-node degree and mean length of the edges ending at the node (``edge_index[1]``), float64 ``[N]``.

    City-Networks' augmented features average edge features over edges whose ``edge_index[1]`` is the node;
    on a symmetric edge list that is the mean over incident roads. Isolated nodes get 0.
    """
    ones = torch.ones(edge_index.size(1), dtype=torch.float64)
    degree = scatter(ones, edge_index[1], dim=0, dim_size=num_nodes, reduce="sum")
    lengths = edge_length.to(torch.float64)
    mean_length = scatter(lengths, edge_index[1], dim=0, dim_size=num_nodes, reduce="mean")
    return degree, mean_length


def road_network_data(
    x: torch.Tensor,
    edge_index: torch.Tensor,
    edge_length: torch.Tensor,
    *,
    hops: int = 16,
    num_classes: int = 10,
    labels: bool = True,
    num_workers: int | None = None,
    use_cache: bool = True,
    progress: bool = True,
    **attributes: object,
) -> Data:
    """A road-network ``Data`` with City-Networks labels and the seed-0 10/10/80 split.

    ``edge_index`` must already be symmetric (see :func:`symmetric_edges`) with ``edge_length`` per column.
    With ``labels=False`` the (expensive) eccentricity labels and the masks are left out.
    """
    data = Data(x=x, edge_index=edge_index, edge_length=edge_length.to(torch.float64), num_nodes=x.size(0),
                **attributes)
    if labels:
        add_city_labels(data, hops, num_classes, num_workers=num_workers, use_cache=use_cache,
                        progress=progress)
    return data


def add_city_labels(data: Data, hops: int = 16, num_classes: int = 10, *, num_workers: int | None = None,
                    backend: str = "auto", use_cache: bool = True, progress: bool = True) -> Data:
    """Add ``eccentricity``, ``y`` (:func:`eccentricity_labels` on ``data.edge_length``) and the seed-0
    10/10/80 ``train_mask``/``val_mask``/``test_mask`` to a road-network ``Data``, in place."""
    data.eccentricity, data.y = eccentricity_labels(
        data.edge_index, data.edge_length, data.num_nodes, hops, num_classes,
        num_workers=num_workers, backend=backend, use_cache=use_cache, progress=progress,
    )
    data.train_mask, data.val_mask, data.test_mask = random_split_masks(data.num_nodes)
    return data
