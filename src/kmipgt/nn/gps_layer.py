r"""GraphGPS layer: a local MPNN and a global attention, wired by a norm placement and a combiner, then a
feed-forward block.

A :class:`~kmipgt.nn.gps_layer.GPSLayer` owns its modules (``local``, ``attention``, the norms, the gate,
the FFN: the names of its state) and two stateless strategies that wire them:

- a norm placement, :class:`PostNorm` (GraphGPS: each residual sum normalised) or :class:`PreNorm` (each
  branch's input normalised, the residual stream never);
- a combiner, :class:`Parallel` (GraphGPS: the branches side by side, summed) or :class:`Series` (the
  attention, then the MPNN on its output).

The placement turns a branch's update into its contribution to the layer's sum, and the combiner decides
what each branch sees and sums; neither knows the other's options. A placement or combiner of its own is
one class here and one entry in :data:`NORM_PLACEMENTS` or :data:`COMBINERS`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from torch import Tensor

from kmipgt.nn.attention import build_global_attention
from kmipgt.nn.attention_options import AttentionOptions
from kmipgt.nn.choices import ACTIVATIONS
from kmipgt.nn.local_kinds import LOCAL_KINDS, NO_LOCAL, build_local_mpnn
from kmipgt.nn.norms import build_norm, normalise
from kmipgt.ops.ragged import RaggedLayout


def _one_of(name: str, value: str, choices: dict) -> Any:
    if value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return choices[value]


class PostNorm:
    r"""GraphGPS's post-norm: :math:`\mathrm{Norm}(\mathbf{h} + \mathrm{Drop}(\mathrm{Branch}(\mathbf{h})))`
    per branch, :math:`\mathrm{Norm}(\mathbf{h} + \mathrm{FFN}(\mathbf{h}))` at the end.

    A gated attention branch contributes :math:`\boldsymbol{\alpha} \odot \mathrm{Drop}(\mathrm{Attn})`
    unnormalised (the layer builds no ``norm_attn`` for it). Without ``branch_residual`` the branches drop
    their ``h +``; without the FFN the layer ends with :math:`\sigma(\mathbf{h})` and dropout.
    """

    stream = False  # the layer input is not carried past the branches: each adds it before its norm

    @staticmethod
    def check(layer: GPSLayer) -> None:
        """Post-norm takes every layer."""

    @staticmethod
    def local(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor | None,
        layout: RaggedLayout | None,
    ) -> tuple[Tensor, Tensor]:
        h, edge_attr = layer.local_update(x, edge_index, edge_attr, layout)
        if layer.branch_residual and layer.local_residual and not layer.local_spec.own_residual:
            h = x + h
        return normalise(layer.norm_local, h, batch, layout), edge_attr

    @staticmethod
    def attention(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None,
        residual: bool, layout: RaggedLayout | None,
    ) -> Tensor:
        h = layer.gated(layer.attention_update(x, edge_index, batch, qk_x, layout))
        if residual:
            h = x + h
        return h if layer.norm_attn is None else normalise(layer.norm_attn, h, batch, layout)

    @staticmethod
    def finish(layer: GPSLayer, h: Tensor, batch: Tensor | None, layout: RaggedLayout | None) -> Tensor:
        if not layer.ffn:
            return F.dropout(layer.act(h), layer.dropout, layer.training)
        return normalise(layer.norm_ffn, h + layer.feed_forward(h), batch, layout)


class PreNorm:
    r"""Pre-norm, as in most transformers since GPT-2: the norms move onto the branch inputs and the
    residual stream is never normalised,

    .. math::
        \mathbf{h} &= \mathbf{x} + \mathrm{Drop}(\mathrm{MPNN}(\mathrm{Norm}(\mathbf{x}), \mathbf{e}))
            + \mathrm{Drop}(\mathrm{Attn}(\mathrm{Norm}'(\mathbf{x}))) \\
        \mathbf{h}' &= \mathbf{h} + \mathrm{FFN}(\mathrm{Norm}''(\mathbf{h}))

    (the attention term times the gate where there is one; a local MPNN with its own residual is built
    without it, and its edges become :math:`\mathbf{e} + \hat{\mathbf{e}}`). It needs the residuals, the
    FFN and the parallel combiner; :class:`~kmipgt.nn.model.GraphTransformer` normalises the last layer's
    output once.
    """

    stream = True  # the layer input is carried past the branches, which add their updates to it

    @staticmethod
    def check(layer: GPSLayer) -> None:
        if not (layer.branch_residual and layer.local_residual and layer.ffn and layer.combiner is Parallel):
            raise ValueError(
                "norm_position='pre' needs branch_residual=True, ffn=True, the attention order 'parallel' "
                "and local_residual=True (a norm before a branch needs a residual stream to leave "
                "unnormalised)"
            )

    @staticmethod
    def local(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, edge_attr: Tensor, batch: Tensor | None,
        layout: RaggedLayout | None,
    ) -> tuple[Tensor, Tensor]:
        h, edges = layer.local_update(
            normalise(layer.norm_local, x, batch, layout), edge_index, edge_attr, layout
        )
        if layer.local_spec.own_residual:  # built without its residual: edges is its update
            edges = edge_attr + edges
        return h, edges

    @staticmethod
    def attention(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None,
        residual: bool, layout: RaggedLayout | None,
    ) -> Tensor:
        normed = normalise(layer.norm_attn, x, batch, layout)
        return layer.gated(layer.attention_update(normed, edge_index, batch, qk_x, layout))

    @staticmethod
    def finish(layer: GPSLayer, h: Tensor, batch: Tensor | None, layout: RaggedLayout | None) -> Tensor:
        return h + layer.feed_forward(normalise(layer.norm_ffn, h, batch, layout))


class Parallel:
    r"""GraphGPS's order: both branches read the layer input and their contributions are summed,
    :math:`\mathbf{h}_L + \mathbf{h}_G`. A gated attention branch adds no residual of its own: the local
    branch carries the input."""

    needs_both = False
    beside = True  # the attention is a branch beside the local one

    @staticmethod
    def first(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None,
        layout: RaggedLayout | None,
    ) -> Tensor:
        """What the branches read: the layer input."""
        return x

    @classmethod
    def combine(
        cls, layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, edge_attr: Tensor | None,
        qk_x: Tensor | None, layout: RaggedLayout | None,
    ) -> tuple[Tensor, Tensor | None]:
        """The sum of the branches' contributions (and the stream, under pre-norm), and the edges."""
        placement = layer.placement
        x = cls.first(layer, x, edge_index, batch, qk_x, layout)
        branches = []
        if layer.local is not None:
            h_local, edge_attr = placement.local(layer, x, edge_index, edge_attr, batch, layout)
            branches.append(h_local)
        if layer.attention is not None and cls.beside:
            residual = layer.branch_residual and layer.attention_gate is None
            # Called apart from the append: a kind that runs eagerly breaks a compiled graph here, and the
            # graph after the break would otherwise hold this call's list and recompile on every call.
            attended = placement.attention(layer, x, edge_index, batch, qk_x, residual, layout)
            branches.append(attended)
        return sum(branches, x if placement.stream else 0), edge_attr


class Series(Parallel):
    r"""The attention first, then the rest of the layer (the MPNN-only layer) on its output, so that the
    MPNN passes on what the attention brought in:
    :math:`\mathbf{h}_A = \mathbf{h} + \boldsymbol{\alpha} \odot \mathrm{Drop}(\mathrm{Attn}(\mathbf{h}))`
    with the gate, else :math:`\mathrm{Norm}(\mathbf{h} + \mathrm{Drop}(\mathrm{Attn}(\mathbf{h})))`,
    whatever ``branch_residual`` says (the layer input must reach the MPNN). Needs both branches."""

    needs_both = True
    beside = False

    @staticmethod
    def first(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None,
        layout: RaggedLayout | None,
    ) -> Tensor:
        """What the local branch reads: the attention's output with its residual."""
        return layer.placement.attention(layer, x, edge_index, batch, qk_x, True, layout)


# ``norm_position`` -> placement, the attention's ``order`` -> combiner (their names: NORM_POSITIONS and
# ATTENTION_ORDERS of kmipgt.nn.choices)
NORM_PLACEMENTS: dict[str, type[PostNorm | PreNorm]] = {"post": PostNorm, "pre": PreNorm}
COMBINERS: dict[str, type[Parallel]] = {"parallel": Parallel, "series": Series}


class GPSLayer(torch.nn.Module):
    r"""One GraphGPS layer (Rampášek et al., 2022), by default

    .. math::
        \mathbf{h}_L &= \mathrm{Norm}(\mathbf{h} + \mathrm{Drop}(\mathrm{MPNN}(\mathbf{h}, \mathbf{e}))) \\
        \mathbf{h}_G &= \mathrm{Norm}(\mathbf{h} + \mathrm{Drop}(\mathrm{Attn}(\mathbf{h}))) \\
        \mathbf{h}' &= \mathrm{Norm}(\mathbf{h}_L + \mathbf{h}_G + \mathrm{FFN}(\mathbf{h}_L + \mathbf{h}_G))

    The layer owns its modules (``local``, ``attention``, ``norm_local``, ``norm_attn``,
    ``attention_gate``, ``ffn_in``, ``ffn_out``, ``norm_ffn``); where the norms sit (``norm_position``)
    and how the branches combine (the attention's ``order``) are the strategies of :data:`NORM_PLACEMENTS` and
    :data:`COMBINERS` above, each documented there. The local MPNN is a kind of
    :mod:`kmipgt.nn.local_kinds` (GatedGCN carries its own residual, dropout and edge update), the
    attention one of :mod:`kmipgt.nn.attention_kinds`. Either branch may be absent (``"none"``), but not
    both.

    ``forward(..., qk_x=...)`` lets the attention's queries and keys come from another input (e.g. the
    positional encodings; build the layer with ``attn_kwargs={"qk_channels": P}``) while its values come
    from ``x``.

    Args:
        channels: hidden size.
        local: local MPNN kind (``LOCAL_KINDS.names()`` of :mod:`kmipgt.nn.local_kinds`).
        attention: global attention kind (``ATTENTION_KINDS.names()`` of :mod:`kmipgt.nn.attention_kinds`).
        dropout: dropout after each branch and inside the FFN.
        norm: ``"layer"``, ``"batch"`` or ``"graph"`` (:func:`~kmipgt.nn.norms.build_norm`).
        activation: FFN activation (``"gelu"`` or ``"relu"``).
        branch_residual: add the layer input to each branch's output (else a GCN-style layer replaces
            each node by its aggregate).
        local_residual: with ``branch_residual``, the local branch's own: ``False`` drops the residual on
            the nodes of the local branch alone (a GatedGCN keeps its edges'), as the reference's k-MIP
            models build their GatedGCN; the attention branch keeps its residual.
        ffn: end with the feed-forward block (else with the activation alone; with
            ``branch_residual=False`` and ``local="gcn"``: SGFormer's GCN layer beside an attention).
        norm_position: norm placement, ``"post"`` or ``"pre"`` (:data:`NORM_PLACEMENTS`).
        checkpoint: activation checkpointing in training (non-reentrant ``torch.utils.checkpoint``): only
            the layer's inputs are kept for backward and the layer is recomputed there, trading one more
            forward pass for its activations. Dropout masks and the k-MIP selection are recomputed
            identically, so loss and gradients equal the plain run.
        attn_kwargs: the attention branch's options, :class:`~kmipgt.nn.attention_options.AttentionOptions`
            (``heads``, ``head_dim``, ``dropout``, ``qk_channels``, ``gate``, ``drop_path``, ``order``),
            and beside them the options of the attention kind's core (``{"heads": 4, "k": 16}`` for
            k-MIP), passed on untouched.
    """

    def __init__(
        self,
        channels: int,
        local: str = "gatedgcn",
        attention: str = "kmip",
        dropout: float = 0.0,
        norm: str = "layer",
        activation: str = "gelu",
        branch_residual: bool = True,
        local_residual: bool = True,
        ffn: bool = True,
        norm_position: str = "post",
        checkpoint: bool = False,
        attn_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        options = AttentionOptions.from_kwargs(attn_kwargs)
        self.combiner = COMBINERS[options.order]
        self.placement = _one_of("norm_position", norm_position, NORM_PLACEMENTS)
        self.channels, self.local_kind, self.attention_kind = channels, local, attention
        self.attention_order, self.norm_position = options.order, norm_position
        self.dropout, self.attention_drop_path = dropout, options.drop_path
        self.activation, self.branch_residual, self.ffn = activation, branch_residual, ffn
        self.local_residual, self.checkpoint = local_residual, checkpoint
        self.placement.check(self)
        self.local_spec = None if local == NO_LOCAL else LOCAL_KINDS.lookup(local)
        # A pre-norm layer adds an own-residual MPNN's residual itself: the MPNN sees Norm(x), the stream x.
        residual = branch_residual and not self.placement.stream
        self.local = build_local_mpnn(
            local, channels, dropout, residual=residual, node_residual=local_residual
        )
        self.attention = build_global_attention(
            attention, channels, options.heads, head_dim=options.head_dim, dropout=options.dropout,
            qk_channels=options.qk_channels, attn_kwargs=options.core,
        )
        both = self.local is not None and self.attention is not None
        if self.local is None and self.attention is None:
            raise ValueError(f"GPSLayer needs a local MPNN or a global attention; both are {NO_LOCAL!r}")
        if options.gate and not both:
            raise ValueError("the attention gate needs both a local MPNN and a global attention")
        if self.combiner.needs_both and not both:
            raise ValueError(
                f"attention order {options.order!r} needs both a local MPNN and a global attention"
            )
        self.norm_local = build_norm(norm, channels) if self.local is not None else None
        # A gated post-norm attention adds alpha * Attn unnormalised: the gate, not a norm, sets its scale.
        attention_norm = self.attention is not None and (self.placement.stream or not options.gate)
        self.norm_attn = build_norm(norm, channels) if attention_norm else None
        self.attention_gate = torch.nn.Parameter(torch.zeros(channels)) if options.gate else None
        if ffn:
            self.ffn_in = torch.nn.Linear(channels, 2 * channels)
            self.ffn_out = torch.nn.Linear(2 * channels, channels)
            self.norm_ffn = build_norm(norm, channels)

    def reset_parameters(self) -> None:
        for module in self.children():
            if hasattr(module, "reset_parameters"):
                module.reset_parameters()
        if self.attention_gate is not None:
            torch.nn.init.zeros_(self.attention_gate)

    def local_update(
        self, x: Tensor, edge_index: Tensor, edge_attr: Tensor, layout: RaggedLayout | None = None
    ) -> tuple[Tensor, Tensor]:
        """The local MPNN on ``x``: an own-residual kind's nodes and edges as it returns them, another
        kind's nodes dropped out and the edges unchanged. An own-residual kind (GatedGCN, whose BatchNorms
        pool over rows) gets the real rows of a padded batch from ``layout``."""
        if self.local_spec.own_residual:
            if layout is not None and (layout.node_mask is not None or layout.edge_mask is not None):
                return self.local(
                    x, edge_index, edge_attr, node_mask=layout.node_mask, edge_mask=layout.edge_mask
                )
            return self.local(x, edge_index, edge_attr)
        args = (edge_attr,) if self.local_spec.supports_edge_attr else ()
        return self._branch_dropout(self.local(x, edge_index, *args)), edge_attr

    def attention_update(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None,
        layout: RaggedLayout | None = None,
    ) -> Tensor:
        """The attention's output on ``x``, dropped out and, per node, dropped (stochastic depth)."""
        h = self._branch_dropout(self.attention(x, edge_index, batch, qk_x=qk_x, layout=layout))
        if self.attention_drop_path and self.training:
            h = h * F.dropout(h.new_ones(h.size(0), 1), self.attention_drop_path)
        return h

    def gated(self, h: Tensor) -> Tensor:
        """``h`` times the attention gate, where there is one."""
        return h if self.attention_gate is None else self.attention_gate * h

    def _branch_dropout(self, h: Tensor) -> Tensor:
        # Without the FFN block the layer drops out once, after its activation, as PyG's BasicGNN does;
        # dropping each branch too would drop the local branch twice per layer.
        return F.dropout(h, self.dropout, self.training) if self.ffn else h

    def act(self, x: Tensor) -> Tensor:
        return F.gelu(x) if self.activation == "gelu" else F.relu(x)

    def feed_forward(self, x: Tensor) -> Tensor:
        h = F.dropout(self.act(self.ffn_in(x)), self.dropout, self.training)
        return F.dropout(self.ffn_out(h), self.dropout, self.training)

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
        qk_x: Tensor | None = None,
        layout: RaggedLayout | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``x [N, C]``, ``edge_index [2, E]``, ``batch [N]``, ``edge_attr [E, C]``, ``qk_x [N, P]``
        -> (x', edge_attr'). ``layout``: the batch's graphs as the attention reads them
        (:func:`~kmipgt.ops.ragged.batch_layout`; None: from ``batch``, or one graph)."""
        if self.local is not None and edge_attr is None and self.local_spec.supports_edge_attr:
            raise ValueError(
                f"edge_attr [E, {self.channels}] is required by the local MPNN {self.local_kind!r}"
            )
        if self.checkpoint and self.training and torch.is_grad_enabled():
            return torch.utils.checkpoint.checkpoint(
                self._layer, x, edge_index, batch, edge_attr, qk_x, layout, use_reentrant=False
            )
        return self._layer(x, edge_index, batch, edge_attr, qk_x, layout)

    def _layer(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None, edge_attr: Tensor | None,
        qk_x: Tensor | None, layout: RaggedLayout | None,
    ) -> tuple[Tensor, Tensor | None]:
        h, edge_attr = self.combiner.combine(self, x, edge_index, batch, edge_attr, qk_x, layout)
        return self.placement.finish(self, h, batch, layout), edge_attr

    def __repr__(self) -> str:
        order = "" if self.attention_order == "parallel" else f", attention_order={self.attention_order!r}"
        order += "" if self.norm_position == "post" else f", norm_position={self.norm_position!r}"
        return (
            f"{self.__class__.__name__}({self.channels}, local={self.local_kind}, "
            f"attention={self.attention!r}{order})"
        )
