"""Datasets that need no network: road networks with City-Networks labels, local benchmark copies, PEs.

:func:`list_datasets` names the datasets that configs, ``kmipgt data`` and :func:`load_dataset` know.

The names below are imported on first use (:func:`kmipgt.lazy.lazy_package`), so that the registry
(:mod:`kmipgt.data.registry`) loads without torch: a config's ``data.name`` is checked before torch is
imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kmipgt.lazy import lazy_package

if TYPE_CHECKING:
    from kmipgt.data.city_labels import eccentricity_labels, partition_labels, road_adjacency
    from kmipgt.data.city_networks import CityNetworks, load_city_network
    from kmipgt.data.graph_file import load_graph
    from kmipgt.data.helsinki import HELSINKI_FEATURES, helsinki
    from kmipgt.data.lrgb import lrgb_dataset, lrgb_splits
    from kmipgt.data.minnesota import MINNESOTA_FEATURES, minnesota
    from kmipgt.data.point_cloud import digits_knn, knn_graph, knn_graph_dataset
    from kmipgt.data.positional_encodings import LaplacianPE, RandomWalkSE
    from kmipgt.data.registry import (
        DATASETS,
        CategoricalFeatures,
        Dataset,
        get_dataset,
        list_datasets,
        load_dataset,
    )
    from kmipgt.data.road_graph import add_city_labels, haversine_metres, road_network_data, symmetric_edges
    from kmipgt.data.splits import index_to_mask, random_split_masks, redraw_split_masks
    from kmipgt.data.synthetic_city import SYNTHETIC_CITY_FEATURES, synthetic_city
    from kmipgt.data.synthetic_parts import SYNTHETIC_PART_CATEGORIES, synthetic_parts
    from kmipgt.data.synthetic_rooms import synthetic_rooms
    from kmipgt.data.virtual_node import add_virtual_node, virtual_node_mask

# Public name -> the submodule that defines it.
_SOURCES = {
    "CategoricalFeatures": "registry",
    "CityNetworks": "city_networks",
    "DATASETS": "registry",
    "Dataset": "registry",
    "HELSINKI_FEATURES": "helsinki",
    "LaplacianPE": "positional_encodings",
    "MINNESOTA_FEATURES": "minnesota",
    "RandomWalkSE": "positional_encodings",
    "SYNTHETIC_CITY_FEATURES": "synthetic_city",
    "SYNTHETIC_PART_CATEGORIES": "synthetic_parts",
    "add_city_labels": "road_graph",
    "add_virtual_node": "virtual_node",
    "digits_knn": "point_cloud",
    "eccentricity_labels": "city_labels",
    "get_dataset": "registry",
    "haversine_metres": "road_graph",
    "helsinki": "helsinki",
    "index_to_mask": "splits",
    "knn_graph": "point_cloud",
    "knn_graph_dataset": "point_cloud",
    "list_datasets": "registry",
    "load_city_network": "city_networks",
    "load_dataset": "registry",
    "load_graph": "graph_file",
    "lrgb_dataset": "lrgb",
    "lrgb_splits": "lrgb",
    "minnesota": "minnesota",
    "partition_labels": "city_labels",
    "random_split_masks": "splits",
    "redraw_split_masks": "splits",
    "road_adjacency": "city_labels",
    "road_network_data": "road_graph",
    "symmetric_edges": "road_graph",
    "synthetic_city": "synthetic_city",
    "synthetic_parts": "synthetic_parts",
    "synthetic_rooms": "synthetic_rooms",
    "virtual_node_mask": "virtual_node",
}

__all__ = [
    "DATASETS",
    "HELSINKI_FEATURES",
    "MINNESOTA_FEATURES",
    "SYNTHETIC_CITY_FEATURES",
    "SYNTHETIC_PART_CATEGORIES",
    "CategoricalFeatures",
    "CityNetworks",
    "Dataset",
    "LaplacianPE",
    "RandomWalkSE",
    "add_city_labels",
    "add_virtual_node",
    "digits_knn",
    "eccentricity_labels",
    "get_dataset",
    "haversine_metres",
    "helsinki",
    "index_to_mask",
    "knn_graph",
    "knn_graph_dataset",
    "list_datasets",
    "load_city_network",
    "load_dataset",
    "load_graph",
    "lrgb_dataset",
    "lrgb_splits",
    "minnesota",
    "partition_labels",
    "random_split_masks",
    "redraw_split_masks",
    "road_adjacency",
    "road_network_data",
    "symmetric_edges",
    "synthetic_city",
    "synthetic_parts",
    "synthetic_rooms",
    "virtual_node_mask",
]


lazy_package(__name__, _SOURCES)
