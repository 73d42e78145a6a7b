"""The registry of local MPNN kinds of the GPS layers: each kind registers its name, builder and capabilities.

As PyG's ``BasicGNN`` flags ``supports_edge_attr`` on the class, a kind says here whether it reads edge
features and whether it carries its own residual; the GPS layer, the model's edge encoder, the branch
monitor and the partitioned model act on these flags instead of on kind names or layer classes.
``"none"`` (no local MPNN) is not a kind: it is the absence of one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch_geometric.nn import GATConv, GCNConv, GINEConv, SAGEConv

from kmipgt.nn.gated_gcn import GatedGCNLayer

__all__ = [
    "NO_LOCAL",
    "LocalKind",
    "build_local_mpnn",
    "local_kind",
    "local_kinds",
    "register_local",
    "registered_local",
]

NO_LOCAL = "none"
# ``build(channels, dropout, residual)``: the MPNN mapping ``channels`` to ``channels``; ``residual`` is
# read only by kinds that carry their own residual.
LocalBuilder = Callable[[int, float, bool], torch.nn.Module]


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


_KINDS: dict[str, LocalKind] = {}


def register_local(kind: LocalKind) -> LocalKind:
    """Add ``kind`` under its name (ValueError if taken or ``"none"``)."""
    if kind.name == NO_LOCAL:
        raise ValueError(f"{NO_LOCAL!r} means no local MPNN and cannot name a kind")
    if kind.name in _KINDS:
        raise ValueError(f"a local MPNN kind named {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def registered_local() -> Mapping[str, LocalKind]:
    """Read-only view ``name -> LocalKind`` of every registered kind, in registration order."""
    return MappingProxyType(_KINDS)


def local_kinds() -> tuple[str, ...]:
    """The names a layer's ``local`` takes: every registered kind, then ``"none"``."""
    return (*_KINDS, NO_LOCAL)


def local_kind(name: str) -> LocalKind:
    """The kind registered as ``name``; ValueError naming every ``local`` value otherwise."""
    if not isinstance(name, str) or name not in _KINDS:
        raise ValueError(f"local MPNN must be one of {local_kinds()}, got {name!r}")
    return _KINDS[name]


def build_local_mpnn(
    kind: str, channels: int, dropout: float = 0.0, residual: bool = True
) -> torch.nn.Module | None:
    """The local MPNN of ``kind`` (:func:`local_kinds`) on ``channels``, or ``None`` for ``"none"``.
    ``residual`` is the own residual connection of a kind that carries one (GatedGCN); the GPS layer adds
    the others'."""
    if kind == NO_LOCAL:
        return None
    return local_kind(kind).build(channels, dropout, residual)


def _gine(channels: int, dropout: float, residual: bool) -> torch.nn.Module:
    mlp = torch.nn.Sequential(
        torch.nn.Linear(channels, channels), torch.nn.ReLU(), torch.nn.Linear(channels, channels)
    )
    return GINEConv(mlp, edge_dim=channels)


for _kind in (
    # GraphGPS's GatedGCN: edge updates, its own residual and dropout.
    LocalKind(
        "gatedgcn", lambda c, p, residual: GatedGCNLayer(c, dropout=p, residual=residual),
        supports_edge_attr=True, own_residual=True,
    ),
    # PyG's GINEConv, keeping the edge features unchanged.
    LocalKind("gine", _gine, supports_edge_attr=True),
    LocalKind("sage", lambda c, p, residual: SAGEConv(c, c)),
    # Symmetric normalisation with self-loops, which on a partition would need the halo nodes' degrees too.
    LocalKind("gcn", lambda c, p, residual: GCNConv(c, c), bipartite=False),
    # One head, its attention coefficients dropped out as PyG's GAT model builds it.
    LocalKind("gat", lambda c, p, residual: GATConv(c, c, dropout=p)),
):
    register_local(_kind)
