"""What ``kmipgt data`` prints: a graph's or a set of graphs' statistics; a synthetic city built stage by
stage, timed."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable

import torch
from torch_geometric.data import Data
from torch_geometric.utils import degree

from kmipgt.data.positional_encodings import LaplacianPE, RandomWalkSE
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
        summary["classes"] = int(data.y.max()) + 1
        summary["class_sizes"] = torch.bincount(data.y).tolist()
    for mask in ("train_mask", "val_mask", "test_mask"):
        if mask in data:
            summary[mask] = int(data[mask].sum())
    if "edge_length" in data:
        summary["mean_edge_length_m"] = round(float(data.edge_length.mean()), 2)
    if "eccentricity" in data:
        ecc = data.eccentricity
        summary["eccentricity_m_min_median_max"] = [round(float(v), 1) for v in
                                                    (ecc.min(), ecc.median(), ecc.max())]
    return summary


def graph_set_summary(splits: dict[str, list[Data]]) -> dict[str, object]:
    """Counts of a dataset of graph lists per split (segmentation sets): graphs and nodes per split, the
    nodes' class sizes and, where graphs carry a ``category``, the graphs per category."""
    graphs = [graph for split in splits.values() for graph in split]
    if not graphs:
        raise ValueError("the dataset has no graphs")
    first = graphs[0]
    summary: dict[str, object] = {"graphs": len(graphs)}
    for split, members in splits.items():
        summary[f"{split}_graphs"] = len(members)
    nodes = torch.tensor([graph.num_nodes for graph in graphs])
    summary["nodes"] = int(nodes.sum())
    summary["nodes_per_graph_min_mean_max"] = [int(nodes.min()), round(float(nodes.float().mean()), 1),
                                               int(nodes.max())]
    summary["directed_edges"] = sum(graph.edge_index.size(1) for graph in graphs)
    summary["features"] = first.x.size(1) if first.x is not None else 0
    if "y" in first:
        counts = torch.bincount(torch.cat([graph.y.view(-1) for graph in graphs]))
        summary["classes"] = counts.numel()
        summary["class_sizes"] = counts.tolist()
    if "category" in first:
        categories = torch.cat([graph.category.view(-1) for graph in graphs])
        summary["graphs_per_category"] = torch.bincount(categories).tolist()
    return summary


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
