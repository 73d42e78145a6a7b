"""A dataset that streams its splits, prepared as it is read: the feature statistics for z-scoring (float64
moments) and the label range from one chunk-wise pass over the training split."""

from __future__ import annotations

from functools import partial

import torch
from torch_geometric.data import Data

from kmipgt.data import add_virtual_node
from kmipgt.data.streamed import StreamedGraphs
from kmipgt.train.config import Config
from kmipgt.train.graph_features import prepare_graph

__all__ = ["streamed_level"]


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
    """``graph`` with each feature ``key`` of ``stats`` z-scored in place by its ``(mean, std)``."""
    for key, (mean, std) in stats.items():
        graph[key] = (graph[key] - mean) / std
    return graph


def streamed_level(
    raw: dict[str, StreamedGraphs], config: Config
) -> tuple[dict[str, StreamedGraphs], Data, torch.Tensor]:
    """Streamed splits, each graph prepared as it is read; the feature statistics (z-scoring, from float64
    moments) and the label range come from one chunk-wise pass over the training split.

    ``raw``: the dataset's streamed splits by name (``train``, ``val``, ``test``). Returns the prepared
    splits, the first training graph and the largest label (or label row) of each training chunk.
    """
    splits = {s: graphs.map(partial(prepare_graph, config=config)) for s, graphs in raw.items()}
    first = splits["train"][0]
    keys = []  # the z-scored features
    if config.data.normalize_features:
        keys = ["x", *(["edge_attr"] if first.edge_attr is not None else [])]
    moments: dict[str, tuple] = {key: (0, None, None) for key in keys}
    # Per chunk the largest label (or label row): the output width counted from these is the labels' own.
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
