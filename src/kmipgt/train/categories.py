"""Which input features are category ids (the dataset's registry entry, the virtual node's marker columns)
and the check that ids lie in the embedding tables sized for them."""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from kmipgt.data import get_dataset, list_datasets
from kmipgt.data.graph_checks import check_category_ids
from kmipgt.data.registry import NUMERIC_FEATURES, CategoricalFeatures
from kmipgt.train.config import Config

__all__ = ["check_categories", "feature_categories", "model_categories"]


def check_categories(splits: dict[str, list[Data]], categories: CategoricalFeatures, name: str) -> None:
    """ValueError unless every categorical column holds ids its embedding table has (before a model indexes
    a table by them), naming the dataset, the split and the column."""
    for split, graphs in splits.items():
        for key, sizes in (("x", categories.node), ("edge_attr", categories.edge)):
            if sizes:
                ids = torch.cat([g[key] for g in graphs])
                check_category_ids(ids, sizes, f"dataset {name!r}, {split}: {key}")


def feature_categories(config: Config) -> CategoricalFeatures:
    """Which features of ``config.data``'s dataset are category ids, as its registry entry says (numbers
    for data a caller hands in under a name of its own)."""
    if config.data.name not in list_datasets():
        return NUMERIC_FEATURES
    return get_dataset(config.data.name).categorical_features(**config.data.options)


def _with_virtual_node(categories: CategoricalFeatures) -> CategoricalFeatures:
    """The categories of graphs with :func:`~kmipgt.data.add_virtual_node`'s marker columns (ids 0 and 1):
    one on the nodes, two (into, out of the virtual node) on the edges."""
    return CategoricalFeatures(
        (*categories.node, 2) if categories.node else (), (*categories.edge, 2, 2) if categories.edge else ()
    )


def model_categories(config: Config) -> CategoricalFeatures:
    """Which input features of ``config``'s model are category ids: its dataset's, and at graph level with
    ``data.virtual_node`` the marker columns the virtual node adds. Known from the config alone, so that a
    model can be built for saved weights without reading the data."""
    categories = feature_categories(config)
    if config.task.level == "graph" and config.data.virtual_node:
        return _with_virtual_node(categories)
    return categories
