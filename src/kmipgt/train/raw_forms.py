"""What a loader or a caller hands in, in the two forms the task levels read: one graph, or graph lists per
split.

A PyG ``Dataset`` becomes its graph or its graphs; a list of graphs without a split is split by
``data.split_ratios`` with a seed; a graph's split masks are read (column ``data.split_index`` of masks
holding several splits), or drawn over its labelled nodes where it has none, and checked: one row per node,
no node in two parts, labelled nodes in every part. Each error is one line naming the data's source.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.data import Dataset as PyGDataset

from kmipgt.train.config import Config

__all__ = ["SPLITS", "as_raw", "labelled", "node_split_masks", "source_name"]

SPLITS = ("train", "val", "test")
MASKS = tuple(f"{split}_mask" for split in SPLITS)


def source_name(config: Config) -> str:
    """The data's source as errors name it: the dataset, and the file or folder it reads."""
    options = config.data.options
    where = options.get("path") or options.get("root")
    return f"dataset {config.data.name!r}" + (f" ({where})" if where else "")


def as_raw(data: Any, config: Config) -> Data | Mapping[str, Sequence[Data]]:
    """``data`` (a ``Data``, a PyG ``Dataset``, a list of graphs or graph lists per split) as one graph or
    graph lists per split; a list of several graphs split by ``data.split_ratios``."""
    if isinstance(data, PyGDataset):
        data = data[0] if len(data) == 1 else [data[i] for i in range(len(data))]
    if isinstance(data, (list, tuple)):
        if not data or not all(isinstance(graph, Data) for graph in data):
            raise ValueError(f"{source_name(config)}: a list of data must hold PyG Data graphs, at least one")
        return data[0] if len(data) == 1 else _split_list(list(data), config)
    if isinstance(data, (Data, Mapping)):
        return data
    raise TypeError(f"{source_name(config)}: expected a PyG Data, Dataset, list of Data or graph lists per "
                    f"split, got {type(data).__name__}")


def _seeded_order(count: int, config: Config) -> torch.Tensor:
    seed = config.data.split_seed if config.data.split_seed is not None else 0
    return torch.from_numpy(np.random.RandomState(seed).permutation(count))


def _cut(count: int, config: Config) -> tuple[int, int]:
    """How many of ``count`` items train and validate, by ``data.split_ratios`` (every part one at least,
    where there are three items)."""
    train_share, val_share, _ = config.data.split_ratios
    train, val = round(count * train_share), round(count * val_share)
    if count >= 3:
        train, val = max(train, 1), max(val, 1)
        train = min(train, count - val - 1)
    return train, val


def _split_list(graphs: list[Data], config: Config) -> dict[str, list[Data]]:
    order = _seeded_order(len(graphs), config).tolist()
    train, val = _cut(len(graphs), config)
    parts = (order[:train], order[train:train + val], order[train + val:])
    return {split: [graphs[i] for i in part] for split, part in zip(SPLITS, parts, strict=True)}


def labelled(y: torch.Tensor) -> torch.Tensor:
    """``[N]`` True for nodes with a label: a class id >= 0 (PyG marks unlabelled nodes -1), or numbers
    that are not NaN."""
    if y.is_floating_point():
        known = ~y.isnan()
        return known if known.dim() == 1 else known.all(-1)
    return y >= 0 if y.dim() == 1 else (y >= 0).all(-1)


def _read_masks(graph: Data, config: Config) -> tuple[torch.Tensor, ...]:
    """The graph's train/val/test masks, column ``data.split_index`` of masks holding several splits."""
    where, index, n = source_name(config), config.data.split_index, graph.num_nodes
    masks = []
    for name in MASKS:
        mask = torch.as_tensor(graph[name])
        if mask.dtype != torch.bool or mask.dim() not in (1, 2) or mask.size(0) != n:
            raise ValueError(f"{where}: {name} must be a boolean mask of one row per node, [{n}] or "
                             f"[{n}, S], got {mask.dtype} {list(mask.shape)}")
        if mask.dim() == 2:
            if index >= mask.size(1):
                raise ValueError(f"{where}: data.split_index {index} picks a split of {name}, which holds "
                                 f"{mask.size(1)} (columns 0 to {mask.size(1) - 1})")
            mask = mask[:, index]
        masks.append(mask)
    return tuple(masks)


def _drawn_masks(known: torch.Tensor, config: Config) -> tuple[torch.Tensor, ...]:
    """Masks of a seeded split of the labelled nodes by ``data.split_ratios``."""
    nodes = known.nonzero().flatten()
    nodes = nodes[_seeded_order(nodes.numel(), config)]
    train, val = _cut(nodes.numel(), config)
    masks = []
    for part in (nodes[:train], nodes[train:train + val], nodes[train + val:]):
        mask = torch.zeros(known.numel(), dtype=torch.bool)
        mask[part] = True
        masks.append(mask)
    return tuple(masks)


def node_split_masks(graph: Data, config: Config, training: bool = True) -> tuple[torch.Tensor, ...]:
    """``(train, val, test)`` boolean ``[N]`` masks of a node-level graph, read or drawn, checked for
    training (``training=False``: read as they are, for predictions on a graph that may have no labels)."""
    where = source_name(config)
    if not training:
        return _read_masks(graph, config)
    if graph.get("y") is None:
        raise ValueError(f"{where}: the graph has no labels y to train on")
    y = graph.y
    if y.size(0) != graph.num_nodes:
        raise ValueError(f"{where}: y must hold a label per node ({graph.num_nodes}), got {list(y.shape)}")
    known = labelled(y)
    present = [name for name in MASKS if graph.get(name) is not None]
    if present and len(present) < 3:
        missing = sorted(set(MASKS) - set(present))
        raise ValueError(f"{where}: the graph has {', '.join(present)} but no {', '.join(missing)}")
    masks = dict(zip(SPLITS, _read_masks(graph, config) if present else _drawn_masks(known, config),
                     strict=True))
    for first, second in combinations(SPLITS, 2):
        both = int((masks[first] & masks[second]).sum())
        if both:
            raise ValueError(f"{where}: {first}_mask and {second}_mask overlap in {both} nodes")
    for split, mask in masks.items():
        if not bool((mask & known).any()):
            raise ValueError(f"{where}: the {split} split holds no labelled node")
    unlabelled = int((masks["train"] & ~known).sum())
    if unlabelled:
        raise ValueError(f"{where}: train_mask holds {unlabelled} nodes without a label (y -1 or NaN)")
    # Unlabelled nodes of the evaluation splits have nothing to be scored against.
    return masks["train"], masks["val"] & known, masks["test"] & known
