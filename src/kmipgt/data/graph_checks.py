"""Checks of graphs read from files, made right after reading and before any array is indexed by them.

A copy from elsewhere can hold anything a tensor can: an edge list of three rows, float or out-of-range node
ids, a class id of 10^12 (a model sized by it would ask for terabytes), no nodes at all. Each check raises a
ValueError whose message starts with ``name``, which the loaders make the file and the tensor
(``paris/edge_indices.pt: edge_index``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["MAX_CLASSES", "check_category_ids", "check_class_labels", "check_edge_index", "check_finite",
           "check_graph_edges", "check_node_rows", "check_split_masks", "class_count"]

# More classes than any node or graph classification benchmark has; a label beyond it is a corrupt file.
MAX_CLASSES = 65_536


def _tensor(value: Any, name: str) -> Tensor:
    if not isinstance(value, Tensor):
        raise ValueError(f"{name} must be a tensor, got {type(value).__name__}")
    return value


def check_node_rows(x: Any, name: str) -> Tensor:
    """``x`` when it is a ``[N, F]`` tensor with ``N >= 1`` (an empty graph is refused)."""
    x = _tensor(x, name)
    if x.dim() != 2:
        raise ValueError(f"{name} must have shape [N, F], got {list(x.shape)}")
    if x.size(0) == 0:
        raise ValueError(f"{name} has no rows: the graph has no nodes")
    return x


def check_finite(values: Tensor, name: str) -> Tensor:
    """``values`` when no entry is NaN or infinite (integer tensors always pass); the message names the first
    row holding one."""
    if values.is_floating_point():
        bad = ~torch.isfinite(values)
        if bool(bad.any()):
            row = int(bad.reshape(values.size(0), -1).any(1).nonzero()[0])
            raise ValueError(f"{name} holds NaN or infinite values (row {row}): they must be finite numbers")
    return values


def check_split_masks(masks: dict[str, Any], num_nodes: int, name: str) -> None:
    """ValueError unless the masks (``{"train_mask": ..., ...}``, each absent or None allowed) are boolean
    tensors of one shape, ``[N]`` or ``[N, S]`` (S splits side by side), that no node is in twice."""
    given = {key: _tensor(mask, f"{name}: {key}") for key, mask in masks.items() if mask is not None}
    for key, mask in given.items():
        if mask.dtype != torch.bool or mask.dim() not in (1, 2) or mask.size(0) != num_nodes:
            raise ValueError(f"{name}: {key} must be a boolean tensor of shape [{num_nodes}] or "
                             f"[{num_nodes}, S] (one row per node), got {mask.dtype} {list(mask.shape)}")
    keys = list(given)
    for first, second in ((a, b) for index, a in enumerate(keys) for b in keys[index + 1:]):
        if given[first].shape != given[second].shape:
            raise ValueError(f"{name}: {first} and {second} must have one shape, got "
                             f"{list(given[first].shape)} and {list(given[second].shape)}")
        both = given[first] & given[second]
        if bool(both.any()):
            node = int(both.reshape(num_nodes, -1).any(1).nonzero()[0])
            raise ValueError(f"{name}: node {node} is in both {first} and {second}: a node is in one split")


def check_edge_index(edge_index: Any, num_nodes: int, name: str) -> Tensor:
    """``edge_index`` as int64 ``[2, E]`` when it is an integer tensor or array of that shape whose ids lie in
    ``[0, num_nodes)``."""
    edge_index = torch.as_tensor(edge_index) if not isinstance(edge_index, Tensor) else edge_index
    if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.is_floating_point() or \
            edge_index.is_complex() or edge_index.dtype == torch.bool:
        raise ValueError(f"{name} must be an integer tensor of shape [2, E], got {edge_index.dtype} "
                         f"{list(edge_index.shape)}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"{name} must hold node ids in [0, {num_nodes}) for {num_nodes} nodes, got ids in "
                         f"[{int(edge_index.min())}, {int(edge_index.max())}]")
    return edge_index.long()


def check_graph_edges(edge_index: Any, edge_slices: Tensor, node_slices: Tensor, name: str) -> Tensor:
    """``edge_index`` of graphs stored together as int64, when the edges ``edge_slices[g]:edge_slices[g+1]``
    of each graph ``g`` hold ids of its own nodes, ``[0, node_slices[g+1] - node_slices[g])`` (ids counted
    from each graph's first node, as ``InMemoryDataset`` stores them)."""
    edge_index = check_edge_index(edge_index, 2**63 - 1, name)
    counts = edge_slices.diff()
    graph = torch.repeat_interleave(torch.arange(counts.numel()), counts, output_size=edge_index.size(1))
    nodes = node_slices.diff()[graph]
    outside = ((edge_index < 0) | (edge_index >= nodes)).any(0)
    if bool(outside.any()):
        bad = int(graph[outside][0])
        ids, size = edge_index[:, graph == bad], int(node_slices[bad + 1] - node_slices[bad])
        raise ValueError(f"{name} of graph {bad} must hold node ids in [0, {size}) for {size} nodes, got ids "
                         f"in [{int(ids.min())}, {int(ids.max())}]")
    return edge_index


def check_class_labels(labels: Any, name: str, count: int | None = None) -> Tensor:
    """``labels`` as int64 when they are an integer tensor (of ``count`` entries where given) of class ids in
    ``[0, MAX_CLASSES)``."""
    labels = _tensor(labels, name)
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer class ids, got {labels.dtype}")
    if count is not None and labels.numel() != count:
        raise ValueError(f"{name} must hold {count} labels, one per node, got {labels.numel()}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= MAX_CLASSES):
        raise ValueError(f"{name} must hold class ids in [0, {MAX_CLASSES}), got ids in "
                         f"[{int(labels.min())}, {int(labels.max())}]")
    return labels.long()


def check_category_ids(values: Any, sizes: tuple[int, ...], name: str) -> Tensor:
    """``values`` when it is an integer ``[R, len(sizes)]`` tensor whose column ``c`` holds category ids in
    ``[0, sizes[c])``: what an embedding table of ``sizes[c]`` rows may be indexed by."""
    values = _tensor(values, name)
    if values.is_floating_point() or values.is_complex() or values.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer category ids, got {values.dtype}")
    if values.dim() != 2 or values.size(1) != len(sizes):
        raise ValueError(f"{name} must have shape [R, {len(sizes)}] (one column per categorical feature), "
                         f"got {list(values.shape)}")
    if values.numel() == 0:
        return values
    low, high = values.amin(0), values.amax(0)
    for column, size in enumerate(sizes):
        if int(low[column]) < 0 or int(high[column]) >= size:
            raise ValueError(f"{name}: column {column} must hold category ids in [0, {size}), got ids in "
                             f"[{int(low[column])}, {int(high[column])}]")
    return values


def class_count(labels: Tensor, name: str) -> int:
    """The number of classes, the largest of ``labels`` (checked by :func:`check_class_labels`) plus one;
    ValueError where there are no labels."""
    if labels.numel() == 0:
        raise ValueError(f"{name} holds no labels, so the number of classes is unknown")
    return int(check_class_labels(labels, name).max()) + 1
