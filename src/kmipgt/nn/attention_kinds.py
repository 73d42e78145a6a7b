"""The registry of global attention kinds: each kind registers its name, core and capabilities.

The attention module, the GPS layers, the model, the config's validation, the explanation and the
partitioned model look a kind up here and act on its flags, never on a list of kind names of their own:
a new kind is one module holding its :class:`~kmipgt.nn.cores.AttentionCore` plus one
``ATTENTION_KINDS.register(AttentionKind(...))`` call. ``"none"`` (no attention) is not a kind: it is the
absence of one.

This module imports no torch: the built-in kinds name their classes as ``"module:Class"``, imported when a
module of the kind is first built (:func:`kmipgt.lazy.resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kmipgt.lazy import resolve
from kmipgt.nn.registry import NONE, KindRegistry

if TYPE_CHECKING:
    import torch

    from kmipgt.nn.cores import AttentionCore

__all__ = ["ATTENTION_KINDS", "EXPLAIN_MODES", "NO_ATTENTION", "AttentionKind"]

NO_ATTENTION = NONE
# How an explanation reads a kind's attended keys: "selection", the keys and weights its forward itself
# used (k-MIP); "top_weights", the largest weights of a softmax over every key, with their mass (full).
EXPLAIN_MODES = ("selection", "top_weights")


@dataclass(frozen=True)
class AttentionKind:
    """One global attention kind and what it can do.

    Attributes:
        name: the ``attention=`` value (config ``model.attention``) that selects it.
        core: its core class (or its ``"module:Class"`` name), built as
            ``core(heads, head_dim, dropout, **attn_kwargs)``.
        module: the :class:`~kmipgt.nn.attention.ProjectedAttention` subclass around the core (or its
            name), for a kind whose module adds attributes or a forward of its own; ``None``:
            ``ProjectedAttention`` itself.
        qk_x: whether its queries and keys may come from a separate input (``qk_x``, the model's
            encoder's ``attention_qk`` other than ``"hidden"``).
        edge_index: whether the core reads the graph's edges (a topological mask); the module then
            requires ``edge_index``.
        float32_only: whether the core has no half-precision kernels: the module then runs in float32,
            outside autocast.
        shardable: whether :mod:`kmipgt.distributed.graph_model` runs it over the nodes of every rank (its
            core a :class:`~kmipgt.nn.cores.KMIPCore`, which the partitioned model swaps for the sharded
            one).
        explain: how :mod:`kmipgt.analysis.explain` reads its attended keys (one of :data:`EXPLAIN_MODES`);
            ``None``: its weights are never materialised, so it cannot be explained.
        compiles: whether ``torch.compile`` traces it (its host work in operators); ``False``: it runs
            eagerly inside a compiled model, with a graph break on each side.
    """

    name: str
    core: type[AttentionCore] | str
    module: type[torch.nn.Module] | str | None = None
    qk_x: bool = True
    edge_index: bool = False
    float32_only: bool = False
    shardable: bool = False
    explain: str | None = None
    compiles: bool = True

    def __post_init__(self) -> None:
        if self.explain is not None and self.explain not in EXPLAIN_MODES:
            raise ValueError(f"explain must be one of {EXPLAIN_MODES} or None, got {self.explain!r}")

    @property
    def core_class(self) -> type[AttentionCore]:
        """The core class, imported on first use."""
        return resolve(self.core)

    @property
    def module_class(self) -> type[torch.nn.Module] | None:
        """The module class around the core (``None``: ``ProjectedAttention``), imported on first use."""
        return resolve(self.module)


# name -> AttentionKind of every registered kind; ``ATTENTION_KINDS.names()``: what ``attention=`` takes.
ATTENTION_KINDS: KindRegistry[AttentionKind] = KindRegistry("attention kind")

for _kind in (
    AttentionKind("kmip", "kmipgt.nn.cores:KMIPCore", "kmipgt.nn.attention:KMIPAttention", shardable=True,
                  explain="selection"),
    AttentionKind("full", "kmipgt.nn.cores:FullCore", "kmipgt.nn.attention:FullAttention",
                  explain="top_weights"),
    AttentionKind("performer", "kmipgt.nn.cores:PerformerCore", "kmipgt.nn.attention:PerformerAttention"),
    # GRF samples and caches its walks on the host, per graph.
    AttentionKind("grf", "kmipgt.nn.grf_core:GRFCore", "kmipgt.nn.attention:GRFAttention", edge_index=True,
                  float32_only=True, compiles=False),
):
    ATTENTION_KINDS.register(_kind)
