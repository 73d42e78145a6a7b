"""The registry of local MPNN kinds of the GPS layers: each kind registers its name, builder and capabilities.

As PyG's ``BasicGNN`` flags ``supports_edge_attr`` on the class, a kind says here whether it reads edge
features and whether it carries its own residual; the GPS layer, the model's edge encoder, the branch
monitor and the partitioned model act on these flags instead of on kind names or layer classes.
``"none"`` (no local MPNN) is not a kind: it is the absence of one.

This module imports no torch: each built-in builder imports its layer when it is first called, so that a
config's ``model.local`` is checked before torch loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kmipgt.nn.registry import NONE, KindRegistry

if TYPE_CHECKING:
    import torch

__all__ = ["LOCAL_KINDS", "NO_LOCAL", "LocalKind", "build_local_mpnn"]

NO_LOCAL = NONE
# ``build(channels, dropout, residual, node_residual)``: the MPNN mapping ``channels`` to ``channels``;
# ``residual`` (nodes and edges) and ``node_residual`` (False: the nodes' dropped) are read only by kinds
# that carry their own residual.
LocalBuilder = Callable[[int, float, bool, bool], "torch.nn.Module"]


@dataclass(frozen=True)
class LocalKind:
    """One local MPNN kind and what it can do.

    Attributes:
        name: the ``local=`` value (config ``model.local``) that selects it.
        build: its builder (``LocalBuilder`` above).
        supports_edge_attr: whether its forward takes ``edge_attr [E, C]`` as third argument.
        own_residual: whether it carries its own residual, dropout and edge update (GraphGPS's GatedGCN
            wiring): it is built with ``residual`` and returns ``(x', edge_attr')``; the other kinds
            return ``x'`` and the GPS layer adds their residual and dropout.
        bipartite: whether it takes a pair ``(x_src, x_dst)`` and updates the ``x_dst`` rows alone, as on a
            graph partition whose sources include a halo (:mod:`kmipgt.distributed.graph_model`).
    """

    name: str
    build: LocalBuilder
    supports_edge_attr: bool = False
    own_residual: bool = False
    bipartite: bool = True


# name -> LocalKind of every registered kind; ``LOCAL_KINDS.names()``: what ``local=`` takes.
LOCAL_KINDS: KindRegistry[LocalKind] = KindRegistry("local MPNN")


def build_local_mpnn(
    kind: str, channels: int, dropout: float = 0.0, residual: bool = True, node_residual: bool = True
) -> torch.nn.Module | None:
    """The local MPNN of ``kind`` (``LOCAL_KINDS.names()``) on ``channels``, or ``None`` for ``"none"``.
    ``residual`` is the own residual connection of a kind that carries one (GatedGCN), ``node_residual``
    ``False`` drops its part on the nodes (the edges keep theirs); the GPS layer adds the others'."""
    if kind == NO_LOCAL:
        return None
    return LOCAL_KINDS.lookup(kind).build(channels, dropout, residual, node_residual)


def _gatedgcn(channels: int, dropout: float, residual: bool, node_residual: bool) -> torch.nn.Module:
    from kmipgt.nn.gated_gcn import GatedGCNLayer

    return GatedGCNLayer(channels, dropout=dropout, residual=residual, node_residual=node_residual)


def _gine(channels: int, dropout: float, residual: bool, node_residual: bool) -> torch.nn.Module:
    import torch
    from torch_geometric.nn import GINEConv

    mlp = torch.nn.Sequential(
        torch.nn.Linear(channels, channels), torch.nn.ReLU(), torch.nn.Linear(channels, channels)
    )
    return GINEConv(mlp, edge_dim=channels)


def _sage(channels: int, dropout: float, residual: bool, node_residual: bool) -> torch.nn.Module:
    from torch_geometric.nn import SAGEConv

    return SAGEConv(channels, channels)


def _gcn(channels: int, dropout: float, residual: bool, node_residual: bool) -> torch.nn.Module:
    from kmipgt.nn.self_loops import StaticLoopGCNConv

    return StaticLoopGCNConv(channels, channels)


def _gat(channels: int, dropout: float, residual: bool, node_residual: bool) -> torch.nn.Module:
    from kmipgt.nn.self_loops import StaticLoopGATConv

    return StaticLoopGATConv(channels, channels, dropout=dropout)


for _kind in (
    # GraphGPS's GatedGCN: edge updates, its own residual and dropout.
    LocalKind("gatedgcn", _gatedgcn, supports_edge_attr=True, own_residual=True),
    # PyG's GINEConv, keeping the edge features unchanged.
    LocalKind("gine", _gine, supports_edge_attr=True),
    LocalKind("sage", _sage),
    # PyG's GCN and GAT, their self-loops added without a data-dependent edge count (so that inductor
    # compiles them). GCN's symmetric normalisation on a partition would need the halo nodes' degrees too.
    LocalKind("gcn", _gcn, bipartite=False),
    # One head, its attention coefficients dropped out as PyG's GAT model builds it.
    LocalKind("gat", _gat),
):
    LOCAL_KINDS.register(_kind)
