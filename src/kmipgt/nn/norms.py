"""The norms of GPS layers and models: node-wise LayerNorm, BatchNorm or PyG's per-graph LayerNorm, and how
each is applied to a batch of graphs."""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn.norm import LayerNorm as GraphLayerNorm

from kmipgt.nn.choices import NORM_KINDS
from kmipgt.nn.padding import masked_batch_norm
from kmipgt.ops.ragged import RaggedLayout

__all__ = ["build_norm", "normalise"]


def build_norm(kind: str, channels: int) -> torch.nn.Module:
    """Node-wise ``LayerNorm`` (``"layer"``), ``BatchNorm1d`` (``"batch"``) or PyG's per-graph
    ``LayerNorm`` (``"graph"``: each graph normalised over all its nodes and channels, as the reference's
    k-MIP models); apply it with :func:`normalise`."""
    if kind == "layer":
        return torch.nn.LayerNorm(channels)
    if kind == "batch":
        return torch.nn.BatchNorm1d(channels)
    if kind == "graph":
        return GraphLayerNorm(channels, mode="graph")
    raise ValueError(f"norm must be one of {NORM_KINDS}, got {kind!r}")


def normalise(norm: torch.nn.Module, h: Tensor, batch: Tensor | None, layout: RaggedLayout | None) -> Tensor:
    """``norm`` of :func:`build_norm` on ``h [N, C]``: a per-graph norm over each graph of ``batch`` (the
    graph count from ``layout``, which PyG would read back from the device), the others node by node; a
    BatchNorm's statistics are those of the real nodes of a padded batch (``layout.node_mask``)."""
    if isinstance(norm, GraphLayerNorm):
        return norm(h, batch, None if layout is None or batch is None else layout.num_graphs)
    if isinstance(norm, torch.nn.BatchNorm1d) and layout is not None:
        return masked_batch_norm(norm, h, layout.node_mask)
    return norm(h)
