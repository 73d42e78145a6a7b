"""Ragged graph layouts: validate PyG ``ptr``/``batch`` and group small graphs into blocks.

A mini-batch of graphs is node-major and ragged, as in PyG: graph ``g`` owns nodes
``ptr[g]:ptr[g + 1]``. Attention never crosses graphs; kernels work on *blocks* of consecutive graphs
so that many small graphs cost one matmul instead of one Python iteration each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["GraphBlock", "graph_blocks", "graph_ptr", "node_graph_bounds"]


def _check_index_tensor(name: str, value: Tensor) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {tuple(value.shape)}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integers, got dtype {value.dtype}")


def _ptr_from_batch(batch: Tensor, num_nodes: int, num_graphs: int | None) -> Tensor:
    _check_index_tensor("batch", batch)
    if batch.numel() != num_nodes:
        raise ValueError(f"`batch` must have one entry per node ({num_nodes}), got {batch.numel()}")
    batch = batch.detach().cpu().long()
    if num_nodes == 0:
        return torch.zeros(1 if num_graphs is None else num_graphs + 1, dtype=torch.long)
    if int(batch.min()) < 0:
        raise ValueError("`batch` must hold non-negative graph ids")
    if bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("`batch` must be sorted (nodes of each graph contiguous, as in PyG's Batch.batch)")
    size = int(batch[-1]) + 1 if num_graphs is None else num_graphs
    counts = torch.bincount(batch, minlength=size)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def graph_ptr(num_nodes: int, *, ptr: Tensor | None = None, batch: Tensor | None = None) -> Tensor:
    """Validated CSR offsets of the graphs in a node-major mini-batch.

    Args:
        num_nodes: N, the number of nodes (rows) in the batch.
        ptr: ``[G + 1]`` offsets, as ``Batch.ptr``: starts at 0, non-decreasing, ends at N.
        batch: ``[N]`` sorted graph id per node, as ``Batch.batch``.

    Returns:
        ``[G + 1]`` int64 offsets on the CPU. Neither argument means a single graph: ``[0, N]``.
        When both are given they must describe the same graphs.
    """
    if ptr is None and batch is None:
        return torch.tensor([0, num_nodes], dtype=torch.long)
    if ptr is None:
        return _ptr_from_batch(batch, num_nodes, None)
    _check_index_tensor("ptr", ptr)
    ptr = ptr.detach().cpu().long()
    if ptr.numel() == 0 or int(ptr[0]) != 0:
        raise ValueError("`ptr` must start at 0 (it holds CSR offsets of shape [num_graphs + 1])")
    if bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError("`ptr` must be non-decreasing")
    if int(ptr[-1]) != num_nodes:
        raise ValueError(f"`ptr` must end at the number of nodes ({num_nodes}), got {int(ptr[-1])}")
    if batch is not None and not torch.equal(_ptr_from_batch(batch, num_nodes, ptr.numel() - 1), ptr):
        raise ValueError("`ptr` and `batch` describe different graphs; pass one of them")
    return ptr


@dataclass(frozen=True)
class GraphBlock:
    """Consecutive graphs ``ptr[first]:ptr[last]`` processed together.

    ``multi`` is true when the block holds more than one non-empty graph, so scores between
    nodes of different graphs must be masked out.
    """

    start: int
    end: int
    multi: bool


def graph_blocks(ptr: Tensor, min_nodes: int) -> list[GraphBlock]:
    """Group consecutive graphs until each block holds at least ``min_nodes`` nodes.

    A block of several graphs costs ``(Σ n_g)²`` scores instead of ``Σ n_g²``; bounding the block size
    keeps that waste small while replacing thousands of tiny kernels by a few larger ones.
    """
    sizes = (ptr[1:] - ptr[:-1]).tolist()
    blocks: list[GraphBlock] = []
    start, graphs_in_block = 0, 0
    for offset, size in zip(ptr[1:].tolist(), sizes):
        if size == 0:
            continue
        graphs_in_block += 1
        if offset - start >= min_nodes:
            blocks.append(GraphBlock(start, offset, graphs_in_block > 1))
            start, graphs_in_block = offset, 0
    end = int(ptr[-1])
    if end > start:
        blocks.append(GraphBlock(start, end, graphs_in_block > 1))
    return blocks


def node_graph_bounds(ptr: Tensor, device: torch.device) -> tuple[Tensor, Tensor]:
    """Per-node ``[N]`` start and end offsets of the node's own graph, on ``device``."""
    sizes = ptr[1:] - ptr[:-1]
    lo = torch.repeat_interleave(ptr[:-1], sizes)
    hi = torch.repeat_interleave(ptr[1:], sizes)
    return lo.to(device), hi.to(device)
