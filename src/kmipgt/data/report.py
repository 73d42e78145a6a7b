"""What ``kmipgt data`` prints: a graph's or a set of graphs' statistics and the time to read them; a
synthetic city built stage by stage, timed."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable, Iterable, Mapping

import torch
from torch_geometric.data import Data
from torch_geometric.utils import degree, homophily

from kmipgt.data.positional_encodings import LaplacianPE, RandomWalkSE
from kmipgt.data.registry import Dataset
from kmipgt.data.road_graph import add_city_labels
from kmipgt.data.synthetic_city import synthetic_city


def graph_summary(data: Data) -> dict[str, object]:
    """Counts and statistics of a node-classification graph, as plain Python values."""
    num_nodes = data.num_nodes
    degrees = degree(data.edge_index[1], num_nodes)
    summary: dict[str, object] = {
        "name": data.get("name", "graph"),
        "nodes": num_nodes,
        "directed_edges": data.edge_index.size(1),
        "features": data.x.size(1) if data.x is not None else 0,
        "mean_degree": round(float(degrees.mean()), 3),
        "max_degree": int(degrees.max()),
        "degree_shares_1_2_3_4_5+": [round(float((degrees == d).float().mean()), 3) for d in (1, 2, 3, 4)]
        + [round(float((degrees >= 5).float().mean()), 3)],
    }
    if "y" in data:
        # A user's graph may leave nodes unlabelled (class id -1, target NaN): they are counted apart.
        given = ~data.y.isnan() if data.y.is_floating_point() else data.y >= 0
        given = given.reshape(given.size(0), -1).all(1)
        if not bool(given.all()):
            summary["unlabelled_nodes"] = int((~given).sum())
        if bool(given.any()):
            summary.update(_label_distribution(data.y[given]))
        if data.y.dim() == 1 and not data.y.is_floating_point():
            summary["edge_homophily"] = _edge_homophily(data.edge_index, data.y)
    for mask in ("train_mask", "val_mask", "test_mask"):
        if mask in data:
            # Several splits as columns ([N, S]): the nodes of each.
            sizes = data[mask].reshape(num_nodes, -1).sum(0).tolist()
            summary[mask] = sizes[0] if data[mask].dim() == 1 else sizes
    if "edge_length" in data:
        summary["mean_edge_length_m"] = round(float(data.edge_length.mean()), 2)
    if "eccentricity" in data:
        ecc = data.eccentricity
        summary["eccentricity_m_min_median_max"] = [round(float(v), 1) for v in
                                                    (ecc.min(), ecc.median(), ecc.max())]
    return summary


def _edge_homophily(edge_index: torch.Tensor, y: torch.Tensor) -> float | None:
    """The share of edges between labelled nodes whose ends share their class (PyG's edge homophily over
    the labelled ends); None where no edge joins two labelled nodes."""
    source, target = edge_index
    both = (y[source] >= 0) & (y[target] >= 0)
    if not bool(both.any()):
        return None
    return round(float(homophily(edge_index[:, both], y, method="edge")), 4)


def _shape(tensor: torch.Tensor | None, rows: str) -> str:
    """A per-graph tensor's shape with its graph-dependent first dimension named, and its dtype:
    ``"[nodes, 9] int64"``; ``"none"`` when the graphs lack it."""
    if tensor is None:
        return "none"
    return f"[{', '.join([rows, *map(str, tensor.shape[1:])])}] {str(tensor.dtype).removeprefix('torch.')}"


def _min_median_max(values: list[int]) -> list[int | float]:
    counts = torch.tensor(values, dtype=torch.float64)
    median = float(counts.quantile(0.5))
    return [int(counts.min()), int(median) if median.is_integer() else median, int(counts.max())]


def _label_distribution(labels: torch.Tensor) -> dict[str, object]:
    """Class ids: their sizes; 0/1 targets (multi-label): the share of positives per column; other
    numbers: min / median / max per column."""
    if not labels.is_floating_point():
        counts = torch.bincount(labels.view(-1))
        return {"classes": counts.numel(), "class_sizes": counts.tolist()}
    columns = labels.reshape(labels.size(0), -1).double()
    if bool(((columns == 0) | (columns == 1)).all()):
        return {"label_positive_shares": [round(float(share), 4) for share in columns.mean(0)]}
    quantiles = columns.quantile(torch.tensor([0.0, 0.5, 1.0], dtype=torch.float64), dim=0)
    return {"label_min_median_max": [[round(float(v), 4) for v in column] for column in quantiles.T]}


def graph_set_summary(splits: Mapping[str, Iterable[Data]]) -> dict[str, object]:
    """Statistics of a dataset of graph lists per split (graph-level sets, segmentation sets), in one pass
    over its graphs (a streamed split is read once, a chunk at a time): graphs per split, nodes and
    directed edges per graph (min / median / max), the shapes of ``x``, ``edge_attr`` and ``y``, the label
    distribution (:func:`_label_distribution`) and, where graphs carry a ``category``, graphs per
    category."""
    summary: dict[str, object] = {}
    nodes, edges, labels, categories = [], [], [], []
    first = None
    for split, graphs in splits.items():
        count = 0
        for graph in graphs:
            first = graph if first is None else first
            count += 1
            nodes.append(graph.num_nodes)
            edges.append(graph.edge_index.size(1))
            if graph.get("y") is not None:
                labels.append(graph.y if graph.y.dim() else graph.y.view(1))
            if graph.get("category") is not None:
                categories.append(graph.category.view(-1))
        summary[f"{split}_graphs"] = count
    if first is None:
        raise ValueError("the dataset has no graphs")
    summary = {"graphs": len(nodes), **summary, "nodes": sum(nodes), "directed_edges": sum(edges)}
    summary["nodes_per_graph_min_median_max"] = _min_median_max(nodes)
    summary["edges_per_graph_min_median_max"] = _min_median_max(edges)
    summary["features"] = first.x.size(1) if first.get("x") is not None else 0
    summary["x_shape"] = _shape(first.get("x"), "nodes")
    summary["edge_attr_shape"] = _shape(first.get("edge_attr"), "edges")
    if labels:
        per_node = first.y.dim() > 0 and first.y.size(0) == first.num_nodes and first.num_nodes > 1
        summary["y_shape"] = _shape(first.y, "nodes" if per_node else "1")
        summary.update(_label_distribution(torch.cat(labels)))
    if categories:
        summary["graphs_per_category"] = torch.bincount(torch.cat(categories)).tolist()
    return summary


def dataset_summary(dataset: Dataset, **options: object) -> dict[str, object]:
    """:func:`graph_summary` or :func:`graph_set_summary` of ``dataset`` loaded with ``options``, and
    ``read_seconds``: the wall-clock time of loading it and reading every graph once (a streamed split is
    read as the summary goes through it)."""
    start = time.perf_counter()
    data = dataset.load(**options)
    if isinstance(data, (list, tuple)):  # a set of graphs without a split
        data = {"all": data}
    summary = graph_set_summary(data) if isinstance(data, Mapping) else graph_summary(data)
    return {**summary, "read_seconds": round(time.perf_counter() - start, 2)}


def _cpu_seconds() -> float:
    """CPU time of this process plus its finished children (the labelling workers)."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def timed_synthetic_city(
    num_nodes: int,
    seed: int = 0,
    *,
    arterial_fraction: float = 1e-3,
    num_edges: int | None = None,
    labels: bool = True,
    hops: int = 16,
    num_workers: int | None = None,
    backend: str = "auto",
    rwse_steps: int = 0,
    lappe_k: int = 0,
) -> tuple[Data, dict[str, tuple[float, float]]]:
    """A synthetic city built stage by stage (generation, labels, RWSE, LapPE), with each stage's
    (wall seconds, CPU seconds incl. worker processes); labels are computed afresh, never read from the cache.
    """
    stages: list[tuple[str, Callable[[Data | None], Data]]] = [
        ("generation", lambda _: synthetic_city(num_nodes, seed, arterial_fraction=arterial_fraction,
                                                num_edges=num_edges, labels=False, hops=hops)),
    ]
    if labels:
        stages.append(("labels", lambda data: add_city_labels(data, hops, num_workers=num_workers,
                                                              backend=backend, use_cache=False)))
    if rwse_steps:
        stages.append((f"rwse{rwse_steps}", RandomWalkSE(rwse_steps)))
    if lappe_k:
        stages.append((f"lappe{lappe_k}", LaplacianPE(lappe_k)))
    data = None
    timings = {}
    for name, stage in stages:
        wall, cpu = time.perf_counter(), _cpu_seconds()
        data = stage(data)
        timings[name] = (time.perf_counter() - wall, _cpu_seconds() - cpu)
    return data, timings
