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


def _read_masks(graph: Data, config: Config) -> dict[str, torch.Tensor]:
    """The graph's masks among train/val/test, column ``data.split_index`` of masks holding several splits."""
    where, index, n = source_name(config), config.data.split_index, graph.num_nodes
    masks = {}
    for split, name in zip(SPLITS, MASKS, strict=True):
        if graph.get(name) is None:
            continue
        mask = torch.as_tensor(graph[name])
        if mask.dtype != torch.bool or mask.dim() not in (1, 2) or mask.size(0) != n:
            raise ValueError(f"{where}: {name} must be a boolean mask of one row per node, [{n}] or "
                             f"[{n}, S], got {mask.dtype} {list(mask.shape)}")
        if mask.dim() == 2:
            if index >= mask.size(1):
                raise ValueError(f"{where}: data.split_index {index} picks a split of {name}, which holds "
                                 f"{mask.size(1)} (columns 0 to {mask.size(1) - 1})")
            mask = mask[:, index]
        masks[split] = mask
    return masks


def _drawn_masks(free: torch.Tensor, missing: list[str], config: Config) -> dict[str, torch.Tensor]:
    """Masks of the ``missing`` splits: a seeded split of the ``free`` nodes (``[N]``) in proportion to
    their shares of ``data.split_ratios``."""
    nodes = free.nonzero().flatten()
    nodes = nodes[_seeded_order(nodes.numel(), config)]
    shares = torch.tensor([config.data.split_ratios[SPLITS.index(split)] for split in missing])
    ends = (shares.cumsum(0) / shares.sum() * nodes.numel()).round().long().tolist()
    masks, start = {}, 0
    for split, end in zip(missing, ends, strict=True):
        masks[split] = torch.zeros(free.numel(), dtype=torch.bool)
        masks[split][nodes[start:end]] = True
        start = end
    return masks


def node_split_masks(graph: Data, config: Config, training: bool = True) -> tuple[torch.Tensor, ...]:
    """``(train, val, test)`` boolean ``[N]`` masks of a node-level graph: its own (column
    ``data.split_index`` of masks holding several splits), the parts it lacks drawn from its labelled nodes
    outside them (a seeded split by ``data.split_ratios``), checked for training (``training=False``: not
    checked, for predictions on a graph that may have no labels)."""
    where = source_name(config)
    y = graph.get("y")
    if training and y is None:
        raise ValueError(f"{where}: the graph has no labels y to train on")
    if training and y.size(0) != graph.num_nodes:
        raise ValueError(f"{where}: y must hold a label per node ({graph.num_nodes}), got {list(y.shape)}")
    known = labelled(y) if y is not None else torch.zeros(graph.num_nodes, dtype=torch.bool)
    masks = _read_masks(graph, config)
    missing = [split for split in SPLITS if split not in masks]
    if missing:  # drawn from the labelled nodes the graph's masks leave out (KarateClub has train_mask only)
        taken = torch.stack(list(masks.values())).any(0) if masks else torch.zeros_like(known)
        masks.update(_drawn_masks(known & ~taken, missing, config))
    if training:
        _check_masks(masks, known, where)
    # Unlabelled nodes of the evaluation splits have nothing to be scored against.
    return masks["train"], masks["val"] & known, masks["test"] & known


def _check_masks(masks: dict[str, torch.Tensor], known: torch.Tensor, where: str) -> None:
    """ValueError where a node is in two parts, a part holds no labelled node or a training node none."""
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
