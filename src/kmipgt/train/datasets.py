"""A config's data section as model-ready data: the dataset loaded and prepared for its task level.

Each level has its preparation here (one graph with split masks, graph lists per split, a set of graphs with
a label per node, held-out edges), over the graphs that :mod:`kmipgt.train.graph_features` makes
model-ready; which features are category ids is :mod:`kmipgt.train.categories`'s, and a dataset that
streams its splits is prepared as it is read (:mod:`kmipgt.train.streamed_splits`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import Any

import torch
from torch_geometric.data import Data
from torch_geometric.data import Dataset as PyGDataset
from torch_geometric.transforms import RandomLinkSplit
from torch_geometric.utils import is_undirected

from kmipgt.data import add_virtual_node, get_dataset, list_datasets, redraw_split_masks
from kmipgt.data.graph_checks import class_count
from kmipgt.data.registry import NUMERIC_FEATURES, CategoricalFeatures
from kmipgt.data.streamed import StreamedGraphs
from kmipgt.train.categories import check_categories, feature_categories, model_categories
from kmipgt.train.config import Config, TaskConfig
from kmipgt.train.graph_features import (
    add_encodings,
    add_set_encodings,
    label_columns,
    prepare_graph,
    standardise_features,
)
from kmipgt.train.raw_forms import SPLITS, as_raw, labelled, node_split_masks, source_name
from kmipgt.train.streamed_splits import streamed_level
from kmipgt.train.task_inference import resolve_task


@dataclass
class PreparedData:
    """Model-ready data: one graph with split masks (``level="node"``) or graph lists per split.

    ``level="node"`` with ``splits`` (and no ``graph``): inductive node classification, each split a list
    of graphs with a label per node (point-cloud segmentation: one shape or block per graph). A dataset
    that streams its splits (:class:`~kmipgt.data.streamed.StreamedGraphs`) keeps them streamed, each graph
    prepared as it is read.

    ``level="edge"``: each split holds one graph whose ``edge_index`` is the message-passing graph and whose
    ``edge_label_index``/``edge_label`` are the pairs to score (positives 1, sampled non-edges 0).

    ``task``: the task, what the config leaves open read from the data. ``official``: the dataset's own
    evaluator (its metric's name and function, :meth:`kmipgt.data.registry.Dataset.official_metric`), which
    ``task.metric: official`` scores with; None where it has none.

    ``node_categories`` / ``edge_categories``: where the dataset says its features are category ids
    (:class:`~kmipgt.data.registry.CategoricalFeatures`), the number of categories of each column of ``x``
    / ``edge_attr`` (integer ids, checked to lie in range, never z-scored), as a model's embedding tables
    are sized; empty where the features are numbers.
    """

    level: str
    graph: Data | None
    splits: dict[str, Sequence[Data]] | None
    in_channels: int
    edge_channels: int
    out_channels: int
    name: str
    node_categories: tuple[int, ...] = ()
    edge_categories: tuple[int, ...] = ()
    task: TaskConfig | None = None
    official: tuple[str, Callable[..., float]] | None = None


def _check_level(config: Config, level: str | None) -> None:
    dataset = get_dataset(config.data.name)
    if level is not None and level not in dataset.levels:
        raise ValueError(f"dataset {dataset.name!r} serves task.level {dataset.levels}, got {level!r}")


def _check_level_options(config: Config, level: str) -> None:
    """ValueError where a data or task option needs another task level than ``level``."""
    if level != "node" and config.task.label_inputs > 0:
        raise ValueError("task.label_inputs needs task.level: node")
    if level != "node" and config.data.split_seed is not None:
        raise ValueError(f"data.split_seed needs task.level: node, got {level!r}")
    if level != "graph" and config.data.virtual_node:
        raise ValueError(f"data.virtual_node needs task.level: graph, got {level!r}")


def load_raw(config: Config):
    """Load the dataset registered as ``config.data.name`` with ``config.data.options``."""
    _check_level(config, config.task.level)  # before a load that may take minutes
    return get_dataset(config.data.name).load(**config.data.options)


def _training_labels(raw: Data | Mapping[str, Sequence[Data]], source: str, level: str) -> torch.Tensor:
    """The labels the task is read from: a graph's labelled nodes, or the first training graphs'."""
    if isinstance(raw, Data):
        if raw.get("y") is None:
            raise ValueError(f"{source}: the graph has no labels y to train on")
        return raw.y[labelled(raw.y)]
    return torch.cat([graph.y for graph in islice(raw["train"], 1000)])


def _link_splits(graph: Data, config: Config) -> dict[str, list[Data]]:
    """Hold out edges for validation and test (PyG's ``RandomLinkSplit``, one fixed negative per positive).

    Positional encodings are computed on each split's message-passing graph, so held-out edges never leak
    into the inputs; the training pairs' fixed negatives only score the ``train`` split, training itself
    draws fresh ones every epoch.
    """
    graph = Data(x=graph.x, edge_index=graph.edge_index, edge_attr=graph.get("edge_attr"))
    split = RandomLinkSplit(
        num_val=config.data.val_edges,
        num_test=config.data.test_edges,
        is_undirected=is_undirected(graph.edge_index, num_nodes=graph.num_nodes),
        add_negative_train_samples=True,
    )
    parts = split(graph)
    return {name: [add_encodings(part, config)] for name, part in zip(SPLITS, parts, strict=True)}


def _out_channels(targets: torch.Tensor, loss: str, name: str) -> int:
    if loss == "cross_entropy":
        return class_count(targets, f"dataset {name!r}: the training labels y")
    return 1 if targets.dim() == 1 else targets.size(-1)


def _as_split_lists(raw) -> dict[str, list[Data]]:
    if not isinstance(raw, dict) or set(raw) != set(SPLITS):
        raise ValueError(f"a graph-level dataset must be a dict with keys {SPLITS}, got {type(raw).__name__}")
    empty = [split for split in SPLITS if len(raw[split]) == 0]
    if empty:
        raise ValueError(f"a graph-level dataset needs graphs in every split; {empty[0]!r} holds none")
    return {split: list(raw[split]) for split in SPLITS}


def _with_node_labels(graph: Data, name: str) -> Data:
    if graph.y is None or graph.y.size(0) != graph.num_nodes:
        raise ValueError(f"dataset {name!r}: task.level 'node' over a set of graphs needs a label per node "
                         "(y of shape [num_nodes]) on every graph")
    return graph


def _single_graph(raw, level: str) -> Data:
    if not isinstance(raw, Data):
        raise ValueError(
            f"task.level {level!r} needs one graph (torch_geometric Data), got {type(raw).__name__}"
        )
    return raw


def _node_level(raw, config: Config, training: bool = True) -> tuple[Data, Data, torch.Tensor]:
    raw = copy.copy(_single_graph(raw, "node"))
    if raw.num_nodes == 0:
        raise ValueError(f"{source_name(config)}: the graph has no nodes")
    raw.train_mask, raw.val_mask, raw.test_mask = node_split_masks(raw, config, training)
    graph = prepare_graph(raw, config)
    if config.data.split_seed is not None:
        graph.train_mask, graph.val_mask, graph.test_mask = redraw_split_masks(
            graph.train_mask, graph.val_mask, graph.test_mask, config.data.split_seed
        )
    if config.data.normalize_features:
        standardise_features([graph], [graph])
    if config.task.label_inputs > 0:
        if config.task.loss != "cross_entropy":
            raise ValueError("task.label_inputs needs a classification task (task.loss: cross_entropy)")
        # Appended after the z-scoring and after every coordinate column, so coord_columns keep their
        # meaning; evaluation shows every training label, training hides part of them (Trainer).
        num_classes = _out_channels(graph.y, "cross_entropy", config.data.name)
        graph.x = torch.cat([graph.x, label_columns(graph.y, graph.train_mask, num_classes)], 1)
    return graph, graph, graph.y[labelled(graph.y)]


def _graph_level(
    raw, config: Config, categories: CategoricalFeatures = NUMERIC_FEATURES
) -> tuple[dict[str, Sequence[Data]], Data, torch.Tensor]:
    streamed = [isinstance(raw.get(s), StreamedGraphs) for s in SPLITS] if isinstance(raw, dict) else []
    if any(streamed):
        if not all(streamed):
            raise ValueError(f"dataset {config.data.name!r} streams some splits only; stream all or none")
        if categories != NUMERIC_FEATURES:
            raise ValueError(f"dataset {config.data.name!r} streams its splits: its features must be numbers")
        return streamed_level({s: raw[s] for s in SPLITS}, config)
    prepare = partial(prepare_graph, config=config, encodings=False, categories=categories)
    raw_splits = _as_split_lists(raw)
    splits = {s: add_set_encodings([prepare(g) for g in graphs], config) for s, graphs in raw_splits.items()}
    check_categories(splits, categories, config.data.name)
    if config.data.normalize_features:
        standardise_features([g for s in SPLITS for g in splits[s]], splits["train"], categories)
    if config.data.virtual_node:
        splits = {s: [add_virtual_node(g) for g in graphs] for s, graphs in splits.items()}
    return splits, splits["train"][0], torch.cat([g.y for g in splits["train"]])


def _inductive_node_level(raw, config: Config) -> tuple[dict[str, Sequence[Data]], Data, torch.Tensor]:
    """Graph lists per split whose every node has a label (``y [n]`` per graph)."""
    if config.task.label_inputs > 0 or config.data.split_seed is not None:
        raise ValueError("task.label_inputs and data.split_seed need one graph with split masks; "
                         f"dataset {config.data.name!r} is a set of graphs, each in one split")
    splits, first, targets = _graph_level(raw, config)
    check = partial(_with_node_labels, name=config.data.name)
    for split, graphs in splits.items():
        if isinstance(graphs, StreamedGraphs):  # checked as each graph is read
            splits[split] = graphs.map(check)
        else:
            for graph in graphs:
                check(graph)
    return splits, first, targets


def _edge_level(raw, config: Config) -> tuple[dict[str, list[Data]], Data, torch.Tensor]:
    graph = prepare_graph(_single_graph(raw, "edge"), config, encodings=False)
    if config.data.normalize_features:
        standardise_features([graph], [graph])
    splits = _link_splits(graph, config)
    return splits, splits["train"][0], splits["train"][0].edge_label


def prepared_task(config: Config, data: PreparedData) -> TaskConfig:
    """``config.task`` with what it leaves open read from ``data`` (prepared already, at its level)."""
    if data.task is not None:
        return data.task
    task = dataclasses.replace(config.task, level=config.task.level or data.level)
    raw = data.graph if data.graph is not None else data.splits
    return resolve_task(task, raw, partial(_training_labels, raw, f"dataset {data.name!r}"))


def prepare_set_graph(graph: Data, config: Config, training: Sequence[Data] | None = None) -> Data:
    """One more graph of ``config``'s set of graphs, prepared as :func:`prepare_data` prepares the set's:
    features, encodings, features z-scored with the statistics of ``training`` (the set's raw training
    graphs, needed only with ``data.normalize_features``), a virtual node where the config adds them.
    Category ids stay ids and are checked against the dataset's tables, as the set's are."""
    categories = feature_categories(config)
    prepared = prepare_graph(graph, config, categories=categories)
    check_categories({"graph": [prepared]}, categories, config.data.name)
    if config.data.normalize_features:
        if training is None:
            raise ValueError("data.normalize_features: the graph is z-scored with the statistics of the "
                             "training graphs, so pass them (training=...)")
        reference = [prepare_graph(g, config, encodings=False, categories=categories) for g in training]
        standardise_features([prepared], reference, categories)
    return add_virtual_node(prepared) if config.data.virtual_node else prepared


def prepare_data(config: Config, raw: Any = None, training: bool = True) -> PreparedData:
    """Load and prepare the dataset named in ``config.data`` for its task, the task's open keys read from the
    data (:func:`~kmipgt.train.task_inference.resolve_task`; the result's ``task``).

    ``raw``: data to prepare instead of loading ``config.data``'s: one graph, graph lists per split, a list
    of graphs (split by ``data.split_ratios``) or a PyG ``Dataset`` (:func:`~kmipgt.train.raw_forms.as_raw`).
    Which features are category ids is the registry entry's word
    (:meth:`kmipgt.data.registry.Dataset.categorical_features`). ``training=False``: a graph's split masks
    are read as they are, not checked for training (predictions on a graph without labels).
    """
    loaded = raw is None
    if config.task.level is not None:  # what the config says, checked before a load that may take minutes
        _check_level_options(config, config.task.level)
    if loaded:
        raw = load_raw(config)
    listed = isinstance(raw, (list, tuple, PyGDataset))
    raw = as_raw(raw, config)
    if listed and not isinstance(raw, Data):  # data.split_seed drew the split of the list
        config = dataclasses.replace(config, data=dataclasses.replace(config.data, split_seed=None))
    named = config.data.name in list_datasets()
    official = get_dataset(config.data.name).official_metric(**config.data.options) if named else None
    labels = partial(_training_labels, raw, source_name(config))
    task = resolve_task(config.task, raw, labels, official is not None)
    if task.metric == "official" and official is None:
        raise ValueError("task.metric 'official' scores with a dataset's own evaluator; "
                         f"{source_name(config)} has none")
    if loaded and config.task.level is None:  # load_raw checked a level the config gave
        _check_level(config, task.level)
    config = dataclasses.replace(config, task=task)
    level = task.level
    _check_level_options(config, level)
    categories = feature_categories(config)
    graph, splits = None, None
    if level == "node" and isinstance(raw, dict):
        splits, first, targets = _inductive_node_level(raw, config)
    elif level == "node":
        graph, first, targets = _node_level(raw, config, training)
    elif level == "graph":
        splits, first, targets = _graph_level(raw, config, categories)
    elif level == "edge":
        splits, first, targets = _edge_level(raw, config)
    else:
        raise ValueError(f"task.level must be 'node', 'graph' or 'edge', got {level!r}")
    embedded = model_categories(config)
    return PreparedData(
        level=level,
        graph=graph,
        splits=splits,
        in_channels=first.x.size(-1),
        edge_channels=first.edge_attr.size(-1) if first.edge_attr is not None else 0,
        out_channels=_out_channels(targets, config.task.loss, config.data.name),
        name=config.data.name,
        node_categories=embedded.node,
        edge_categories=embedded.edge,
        task=task,
        official=official,
    )
