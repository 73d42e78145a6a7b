"""The Minnesota road network shipped in the pygsp wheel, with City-Networks-style features and labels.

Data: pygsp 0.6.1 ``pointclouds/minnesota.mat`` (from MatlabBGL, D. Gleich; pygsp BSD-3, MatlabBGL BSD),
loaded with ``pygsp.graphs.Minnesota(connected=True)``: 2,642 intersections, 3,304 roads, one connected
component (pygsp adds the road 348-354 that joins the two pieces). Coordinates are longitude/latitude.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch
from torch_geometric.data import Data

from kmipgt.data.road_graph import (
    degree_and_mean_length,
    haversine_metres,
    road_network_data,
    symmetric_edges,
)

MINNESOTA_NUM_NODES = 2642
MINNESOTA_NUM_EDGES = 3304  # undirected
MINNESOTA_FEATURES = ("longitude", "latitude", "degree", "mean_road_length_m")


def _load_pygsp_minnesota() -> tuple[np.ndarray, np.ndarray]:
    """Coordinates ``[N, 2]`` (lon, lat) and undirected edges ``[2, E]`` of pygsp's connected Minnesota."""
    try:
        from pygsp import graphs
    except ImportError as error:
        raise ImportError("minnesota() needs pygsp, which ships the data: pip install pygsp") from error
    with warnings.catch_warnings():
        # pygsp calls scipy.sparse.diags with int64 input; the FutureWarning concerns pygsp, not this data.
        warnings.simplefilter("ignore", FutureWarning)
        graph = graphs.Minnesota(connected=True)
    adjacency = graph.W.tocoo()
    edges = np.stack([adjacency.row, adjacency.col]).astype(np.int64)
    return np.asarray(graph.coords, dtype=np.float64), edges


def minnesota(
    hops: int = 16, num_classes: int = 10, *, use_cache: bool = True, progress: bool = False
) -> Data:
    """Minnesota road network as a PyG ``Data`` for City-Networks-style node classification.

    - ``x`` float32 ``[2642, 4]``: longitude, latitude (degrees), degree, mean length of incident roads (m),
      raw and unnormalised like City-Networks' features (names in ``MINNESOTA_FEATURES``).
    - ``edge_index`` ``[2, 6608]``: both directions of the 3,304 roads.
    - ``edge_length`` float64 ``[6608]``: great-circle (haversine) distance between the two ends, metres;
      pygsp gives every road weight 1, so lengths come from the coordinates.
    - ``eccentricity`` float64 ``[2642]`` and ``y`` int64 ``[2642]``: :func:`eccentricity_labels` with
      ``hops`` and ``num_classes`` (cached on disk after the first call, which takes a few seconds).
    - ``train_mask``/``val_mask``/``test_mask``: seed-0 random 10/10/80 split.
    - ``pos`` float64 ``[2642, 2]``: the lon/lat coordinates.
    """
    coords, undirected = _load_pygsp_minnesota()
    num_nodes = coords.shape[0]
    edge_index, _ = symmetric_edges(torch.from_numpy(undirected), num_nodes)
    src, dst = edge_index.numpy()
    edge_length = torch.from_numpy(haversine_metres(coords[src], coords[dst]))
    degree, mean_length = degree_and_mean_length(edge_index, edge_length, num_nodes)
    x = torch.cat([torch.from_numpy(coords), degree[:, None], mean_length[:, None]], dim=1).float()
    return road_network_data(
        x, edge_index, edge_length, hops=hops, num_classes=num_classes, use_cache=use_cache,
        progress=progress, pos=torch.from_numpy(coords), name="minnesota",
    )
