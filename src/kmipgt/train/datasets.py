"""Turn a config's data section into model-ready graphs: load, normalise features, add encodings, split."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import RandomLinkSplit
from torch_geometric.utils import is_undirected

from kmipgt.data import (
    LaplacianPE,
    add_virtual_node,
    get_dataset,
    list_datasets,
    redraw_split_masks,
)
from kmipgt.data.graph_checks import check_category_ids, class_count
from kmipgt.data.positional_encodings import random_walk_se_of_graphs
from kmipgt.data.registry import NUMERIC_FEATURES, CategoricalFeatures
from kmipgt.data.streamed import StreamedGraphs
from kmipgt.train.config import Config

SPLITS = ("train", "val", "test")


@dataclass
class PreparedData:
    """Model-ready data: one graph with split masks (``level="node"``) or graph lists per split.

    ``level="node"`` with ``splits`` (and no ``graph``): inductive node classification, each split a list
    of graphs with a label per node (point-cloud segmentation: one shape or block per graph). A dataset
    that streams its splits (:class:`~kmipgt.data.streamed.StreamedGraphs`) keeps them streamed, each graph
    prepared as it is read.

    ``level="edge"``: each split holds one graph whose ``edge_index`` is the message-passing graph and whose
    ``edge_label_index``/``edge_label`` are the pairs to score (positives 1, sampled non-edges 0).

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


def load_raw(config: Config):
    """Load the dataset registered as ``config.data.name`` with ``config.data.options``."""
    dataset = get_dataset(config.data.name)
    if config.task.level not in dataset.levels:  # checked before a load that may take minutes
        raise ValueError(f"dataset {dataset.name!r} serves task.level {dataset.levels}, "
                         f"got {config.task.level!r}")
    return dataset.load(**config.data.options)


def node_coords(graph: Data, coord_columns: list[int] | tuple[int, ...]) -> torch.Tensor | None:
    """``[N, 2]`` node positions: the dataset's ``pos``, else the first two ``coord_columns`` of the
    (z-scored) features, else None."""
    coords = graph.get("pos")
    if coords is None and len(coord_columns) >= 2:
        coords = graph.x[:, list(coord_columns[:2])]
    return coords


def _edge_features(graph: Data, categorical: bool = False) -> torch.Tensor | None:
    """Edge features as ``[E, F]``: ``edge_attr`` if present (category ids as they are, else as floats), else
    log road length (lengths span decades)."""
    if getattr(graph, "edge_attr", None) is not None:
        attr = graph.edge_attr if categorical else graph.edge_attr.float()
        return attr.unsqueeze(-1) if attr.dim() == 1 else attr
    if getattr(graph, "edge_length", None) is not None:
        return torch.log1p(graph.edge_length.float().clamp_min(0)).unsqueeze(-1)
    return None


def _add_encodings(graph: Data, config: Config) -> Data:
    return _add_set_encodings([graph], config)[0]


def _add_set_encodings(graphs: list[Data], config: Config) -> list[Data]:
    """``graphs`` with the configured encodings: LapPE graph by graph, RWSE of them all at once
    (:func:`~kmipgt.data.positional_encodings.random_walk_se_of_graphs`)."""
    if config.data.lappe_dim > 0:
        graphs = [LaplacianPE(config.data.lappe_dim, attr_name="lappe")(graph) for graph in graphs]
        for graph in graphs:
            del graph["lappe_eigval"]
    if config.data.rwse_dim > 0:
        encodings = random_walk_se_of_graphs([g.edge_index for g in graphs], [g.num_nodes for g in graphs],
                                             config.data.rwse_dim)
        graphs = [copy.copy(graph) for graph in graphs]  # as a transform does: the caller's graphs unchanged
        for graph, rwse in zip(graphs, encodings, strict=True):
            graph.rwse = rwse
    return graphs


def _check_categories(splits: dict[str, list[Data]], categories: CategoricalFeatures, name: str) -> None:
    """ValueError unless every categorical column holds ids its embedding table has (before a model indexes
    a table by them), naming the dataset, the split and the column."""
    for split, graphs in splits.items():
        for key, sizes in (("x", categories.node), ("edge_attr", categories.edge)):
            if sizes:
                ids = torch.cat([g[key] for g in graphs])
                check_category_ids(ids, sizes, f"dataset {name!r}, {split}: {key}")


def _standardise(graphs: list[Data], reference: list[Data], key: str) -> None:
    """Z-score ``graph[key]`` columns in place with mean/std taken over the ``reference`` graphs."""
    stacked = torch.cat([g[key] for g in reference])
    mean, std = stacked.mean(0), stacked.std(0).clamp_min(1e-6)
    for graph in graphs:
        graph[key] = (graph[key] - mean) / std


def _prepare_graph(
    graph: Data, config: Config, encodings: bool = True, categories: CategoricalFeatures = NUMERIC_FEATURES
) -> Data:
    if getattr(graph, "x", None) is None:
        raise ValueError(f"dataset {config.data.name!r} has graphs without node features x")
    out = Data(x=graph.x if categories.node else graph.x.float(), edge_index=graph.edge_index, y=graph.y)
    edge_attr = _edge_features(graph, bool(categories.edge))
    if edge_attr is not None:
        out.edge_attr = edge_attr
    # pos: node coordinates, kept for pictures (explain plots); the model reads coordinates from x.
    for key in ("train_mask", "val_mask", "test_mask", "edge_label_index", "edge_label", "pos", "category"):
        if getattr(graph, key, None) is not None:
            out[key] = graph[key]
    return _add_encodings(out, config) if encodings else out


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
    return {name: [_add_encodings(part, config)] for name, part in zip(SPLITS, parts, strict=True)}


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


def _moments(chunks: list[torch.Tensor], count: int, mean: torch.Tensor | None, m2: torch.Tensor | None):
    """``(count, mean, M2)`` of the rows seen so far and those of ``chunks``, in float64 (Chan et al.'s
    pairwise update), so the statistics of a streamed split need one pass and one chunk in memory."""
    rows = torch.cat(chunks).double()
    size, chunk_mean = rows.size(0), rows.mean(0)
    chunk_m2 = ((rows - chunk_mean) ** 2).sum(0)
    if mean is None or m2 is None:
        return size, chunk_mean, chunk_m2
    total = count + size
    delta = chunk_mean - mean
    return total, mean + delta * size / total, m2 + chunk_m2 + delta**2 * count * size / total


def _z_score(graph: Data, stats: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> Data:
    for key, (mean, std) in stats.items():
        graph[key] = (graph[key] - mean) / std
    return graph


def _with_node_labels(graph: Data, name: str) -> Data:
    if graph.y is None or graph.y.size(0) != graph.num_nodes:
        raise ValueError(f"dataset {name!r}: task.level 'node' over a set of graphs needs a label per node "
                         "(y of shape [num_nodes]) on every graph")
    return graph


def _streamed_level(
    raw: dict[str, StreamedGraphs], config: Config
) -> tuple[dict[str, StreamedGraphs], Data, torch.Tensor]:
    """Streamed splits, each graph prepared as it is read; the feature statistics (z-scoring, from float64
    moments) and the label range come from one chunk-wise pass over the training split."""
    splits = {s: raw[s].map(partial(_prepare_graph, config=config)) for s in SPLITS}
    first = splits["train"][0]
    keys = []  # the z-scored features
    if config.data.normalize_features:
        keys = ["x", *(["edge_attr"] if first.edge_attr is not None else [])]
    moments: dict[str, tuple] = {key: (0, None, None) for key in keys}
    # Per chunk the largest label (or label row), so that _out_channels sees what it would in the labels.
    label_max = []
    for chunk in splits["train"].chunks():
        for key in keys:
            moments[key] = _moments([graph[key] for graph in chunk], *moments[key])
        label_max.append(torch.cat([graph.y for graph in chunk]).amax(0))
    stats = {}
    for key in keys:
        count, mean, m2 = moments[key]
        dtype = first[key].dtype
        stats[key] = (mean.to(dtype), (m2 / (count - 1)).sqrt().to(dtype).clamp_min(1e-6))
    if stats:
        splits = {s: graphs.map(partial(_z_score, stats=stats)) for s, graphs in splits.items()}
    if config.data.virtual_node:
        splits = {s: graphs.map(add_virtual_node) for s, graphs in splits.items()}
    return splits, splits["train"][0], torch.stack(label_max)


def _standardise_features(
    graphs: list[Data], reference: list[Data], categories: CategoricalFeatures = NUMERIC_FEATURES
) -> None:
    """Z-score the numeric node and edge features (category ids stay ids)."""
    if not categories.node:
        _standardise(graphs, reference, "x")
    if graphs[0].edge_attr is not None and not categories.edge:
        _standardise(graphs, reference, "edge_attr")


def _single_graph(raw, level: str) -> Data:
    if not isinstance(raw, Data):
        raise ValueError(
            f"task.level {level!r} needs one graph (torch_geometric Data), got {type(raw).__name__}"
        )
    return raw


def label_columns(y: torch.Tensor, shown: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[N, num_classes + 1]``: the one-hot label of the ``shown`` nodes (zeros elsewhere), then
    ``shown``."""
    one_hot = torch.nn.functional.one_hot(y.clamp_min(0), num_classes).float() * shown[:, None]
    return torch.cat([one_hot, shown[:, None].float()], dim=1)


def _node_level(raw, config: Config) -> tuple[Data, Data, torch.Tensor]:
    raw = _single_graph(raw, "node")
    if raw.num_nodes == 0:
        raise ValueError(f"dataset {config.data.name!r}: the graph has no nodes")
    for mask in ("train_mask", "val_mask", "test_mask"):
        if getattr(raw, mask, None) is None:
            raise ValueError(f"task.level 'node' needs {mask} on the graph")
    graph = _prepare_graph(raw, config)
    if config.data.split_seed is not None:
        graph.train_mask, graph.val_mask, graph.test_mask = redraw_split_masks(
            graph.train_mask, graph.val_mask, graph.test_mask, config.data.split_seed
        )
    if config.data.normalize_features:
        _standardise_features([graph], [graph])
    if config.task.label_inputs > 0:
        if config.task.loss != "cross_entropy":
            raise ValueError("task.label_inputs needs a classification task (task.loss: cross_entropy)")
        # Appended after the z-scoring and after every coordinate column, so coord_columns keep their
        # meaning; evaluation shows every training label, training hides part of them (Trainer).
        num_classes = _out_channels(graph.y, "cross_entropy", config.data.name)
        graph.x = torch.cat([graph.x, label_columns(graph.y, graph.train_mask, num_classes)], 1)
    return graph, graph, graph.y


def _graph_level(
    raw, config: Config, categories: CategoricalFeatures = NUMERIC_FEATURES
) -> tuple[dict[str, Sequence[Data]], Data, torch.Tensor]:
    streamed = [isinstance(raw.get(s), StreamedGraphs) for s in SPLITS] if isinstance(raw, dict) else []
    if any(streamed):
        if not all(streamed):
            raise ValueError(f"dataset {config.data.name!r} streams some splits only; stream all or none")
        if categories != NUMERIC_FEATURES:
            raise ValueError(f"dataset {config.data.name!r} streams its splits: its features must be numbers")
        return _streamed_level(raw, config)
    prepare = partial(_prepare_graph, config=config, encodings=False, categories=categories)
    raw_splits = _as_split_lists(raw)
    splits = {s: _add_set_encodings([prepare(g) for g in graphs], config) for s, graphs in raw_splits.items()}
    _check_categories(splits, categories, config.data.name)
    if config.data.normalize_features:
        _standardise_features([g for s in SPLITS for g in splits[s]], splits["train"], categories)
    if config.data.virtual_node:
        splits = {s: [add_virtual_node(g) for g in graphs] for s, graphs in splits.items()}
    return splits, splits["train"][0], torch.cat([g.y for g in splits["train"]])


def _with_virtual_node(categories: CategoricalFeatures) -> CategoricalFeatures:
    """The categories of graphs with :func:`~kmipgt.data.add_virtual_node`'s marker columns (ids 0 and 1):
    one on the nodes, two (into, out of the virtual node) on the edges."""
    return CategoricalFeatures(
        (*categories.node, 2) if categories.node else (), (*categories.edge, 2, 2) if categories.edge else ()
    )


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
    graph = _prepare_graph(_single_graph(raw, "edge"), config, encodings=False)
    if config.data.normalize_features:
        _standardise_features([graph], [graph])
    splits = _link_splits(graph, config)
    return splits, splits["train"][0], splits["train"][0].edge_label


def _feature_categories(config: Config) -> CategoricalFeatures:
    """Which features of ``config.data``'s dataset are category ids, as its registry entry says (numbers
    for data a caller hands in under a name of its own)."""
    if config.data.name not in list_datasets():
        return NUMERIC_FEATURES
    return get_dataset(config.data.name).categorical_features(**config.data.options)


def model_categories(config: Config) -> CategoricalFeatures:
    """Which input features of ``config``'s model are category ids: its dataset's, and at graph level with
    ``data.virtual_node`` the marker columns the virtual node adds. Known from the config alone, so that a
    model can be built for saved weights without reading the data."""
    categories = _feature_categories(config)
    if config.task.level == "graph" and config.data.virtual_node:
        return _with_virtual_node(categories)
    return categories


def prepare_set_graph(graph: Data, config: Config, training: Sequence[Data] | None = None) -> Data:
    """One more graph of ``config``'s set of graphs, prepared as :func:`prepare_data` prepares the set's:
    features, encodings, features z-scored with the statistics of ``training`` (the set's raw training
    graphs, needed only with ``data.normalize_features``), a virtual node where the config adds them.
    Category ids stay ids and are checked against the dataset's tables, as the set's are."""
    categories = _feature_categories(config)
    prepared = _prepare_graph(graph, config, categories=categories)
    _check_categories({"graph": [prepared]}, categories, config.data.name)
    if config.data.normalize_features:
        if training is None:
            raise ValueError("data.normalize_features: the graph is z-scored with the statistics of the "
                             "training graphs, so pass them (training=...)")
        reference = [_prepare_graph(g, config, encodings=False, categories=categories) for g in training]
        _standardise_features([prepared], reference, categories)
    return add_virtual_node(prepared) if config.data.virtual_node else prepared


def prepare_data(config: Config, raw: Any = None) -> PreparedData:
    """Load and prepare the dataset named in ``config.data`` for ``config.task.level``.

    ``raw``: a dataset as its loader returns it (one graph, or graph lists per split) to prepare instead of
    loading ``config.data``'s (e.g. :func:`kmipgt.train.stand_in.stand_in_data`). Which features are
    category ids is the registry entry's word (:meth:`kmipgt.data.registry.Dataset.categorical_features`).
    """
    level = config.task.level
    if level != "node" and config.task.label_inputs > 0:
        raise ValueError("task.label_inputs needs task.level: node")
    if level != "node" and config.data.split_seed is not None:
        raise ValueError(f"data.split_seed needs task.level: node, got {level!r}")
    if level != "graph" and config.data.virtual_node:
        raise ValueError(f"data.virtual_node needs task.level: graph, got {level!r}")
    if raw is None:
        raw = load_raw(config)
    categories = _feature_categories(config)
    graph, splits = None, None
    if level == "node" and isinstance(raw, dict):
        splits, first, targets = _inductive_node_level(raw, config)
    elif level == "node":
        graph, first, targets = _node_level(raw, config)
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
    )
