"""One graph made model-ready: node features as floats or category ids, edge features, positional
encodings, label columns, and features z-scored over reference graphs."""

from __future__ import annotations

import copy

import torch
from torch_geometric.data import Data

from kmipgt.data import LaplacianPE
from kmipgt.data.positional_encodings import random_walk_se_of_graphs
from kmipgt.data.registry import NUMERIC_FEATURES, CategoricalFeatures
from kmipgt.train.config import Config
from kmipgt.train.raw_forms import source_name

__all__ = [
    "add_encodings",
    "add_set_encodings",
    "label_columns",
    "node_coords",
    "prepare_graph",
    "standardise_features",
]


def node_coords(graph: Data, coord_columns: list[int] | tuple[int, ...]) -> torch.Tensor | None:
    """``[N, 2]`` node positions: the dataset's ``pos``, else the first two ``coord_columns`` of the
    (z-scored) features, else None."""
    coords = graph.get("pos")
    if coords is None and len(coord_columns) >= 2:
        coords = graph.x[:, list(coord_columns[:2])]
    return coords


def _class_column(y: torch.Tensor | None) -> torch.Tensor | None:
    """Class ids stored as a column (``[N, 1]``, as OGB stores them) as ``[N]``; other labels as they are."""
    one_column = y is not None and y.dim() == 2 and y.size(1) == 1 and not y.is_floating_point()
    return y.view(-1) if one_column else y


def _edge_features(graph: Data, categorical: bool = False) -> torch.Tensor | None:
    """Edge features as ``[E, F]``: ``edge_attr`` if present (category ids as they are, else as floats), else
    log road length (lengths span decades)."""
    if getattr(graph, "edge_attr", None) is not None:
        attr = graph.edge_attr if categorical else graph.edge_attr.float()
        return attr.unsqueeze(-1) if attr.dim() == 1 else attr
    if getattr(graph, "edge_length", None) is not None:
        return torch.log1p(graph.edge_length.float().clamp_min(0)).unsqueeze(-1)
    return None


def prepare_graph(
    graph: Data, config: Config, encodings: bool = True, categories: CategoricalFeatures = NUMERIC_FEATURES
) -> Data:
    """``graph`` as a model reads it, in a Data of its own: node features (floats, or category ids where
    ``categories.node`` says so), ``edge_index``, ``y``, edge features, the split masks, scored pairs,
    ``pos`` and ``category`` where present; with the configured encodings unless ``encodings`` is False.
    ValueError where the graph has no node features."""
    if getattr(graph, "x", None) is None:
        raise ValueError(f"{source_name(config)} has graphs without node features x")
    out = Data(x=graph.x if categories.node else graph.x.float(), edge_index=graph.edge_index,
               y=_class_column(graph.get("y")))
    edge_attr = _edge_features(graph, bool(categories.edge))
    if edge_attr is not None:
        out.edge_attr = edge_attr
    for key in ("x", "edge_attr"):
        _check_finite(out.get(key), key, config)
    # pos: node coordinates, kept for pictures (explain plots); the model reads coordinates from x.
    # node_ids, label_names: the source's own names of the nodes and classes, which predictions write.
    for key in ("train_mask", "val_mask", "test_mask", "edge_label_index", "edge_label", "pos", "category",
                "node_ids", "label_names"):
        if getattr(graph, key, None) is not None:
            out[key] = graph[key]
    return add_encodings(out, config) if encodings else out


def _check_finite(values: torch.Tensor | None, key: str, config: Config) -> None:
    """ValueError naming the source and ``key`` where its numbers hold NaN or an infinity."""
    if values is not None and values.is_floating_point() and not bool(values.isfinite().all()):
        bad = ~values.isfinite()
        rows = int((bad.any(-1) if bad.dim() > 1 else bad).sum())
        raise ValueError(f"{source_name(config)}: {key} holds NaN or infinite values in {rows} rows")


def add_encodings(graph: Data, config: Config) -> Data:
    """``graph`` with the configured encodings (:func:`add_set_encodings` of one graph)."""
    return add_set_encodings([graph], config)[0]


def add_set_encodings(graphs: list[Data], config: Config) -> list[Data]:
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


def label_columns(y: torch.Tensor, shown: torch.Tensor, num_classes: int) -> torch.Tensor:
    """``[N, num_classes + 1]``: the one-hot label of the ``shown`` nodes (zeros elsewhere), then
    ``shown``."""
    one_hot = torch.nn.functional.one_hot(y.clamp_min(0), num_classes).float() * shown[:, None]
    return torch.cat([one_hot, shown[:, None].float()], dim=1)


def _standardise(graphs: list[Data], reference: list[Data], key: str) -> None:
    """Z-score ``graph[key]`` columns in place with mean/std taken over the ``reference`` graphs."""
    stacked = torch.cat([g[key] for g in reference])
    mean, std = stacked.mean(0), stacked.std(0).clamp_min(1e-6)
    for graph in graphs:
        graph[key] = (graph[key] - mean) / std


def standardise_features(
    graphs: list[Data], reference: list[Data], categories: CategoricalFeatures = NUMERIC_FEATURES
) -> None:
    """Z-score the numeric node and edge features (category ids stay ids)."""
    if not categories.node:
        _standardise(graphs, reference, "x")
    if graphs[0].edge_attr is not None and not categories.edge:
        _standardise(graphs, reference, "edge_attr")


