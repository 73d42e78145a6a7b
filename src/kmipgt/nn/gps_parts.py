r"""How a GPS layer wires its branches: where the norms sit, and how the branches combine.

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

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor

if TYPE_CHECKING:
    from kmipgt.nn.gps_layer import GPSLayer

__all__ = ["COMBINERS", "NORM_PLACEMENTS", "Parallel", "PostNorm", "PreNorm", "Series"]


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
    def local(layer: GPSLayer, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> tuple[Tensor, Tensor]:
        h, edge_attr = layer.local_update(x, edge_index, edge_attr)
        if layer.branch_residual and not layer.local_spec.own_residual:
            h = x + h
        return layer.norm_local(h), edge_attr

    @staticmethod
    def attention(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None,
        residual: bool,
    ) -> Tensor:
        h = layer.gated(layer.attention_update(x, edge_index, batch, qk_x))
        if residual:
            h = x + h
        return h if layer.norm_attn is None else layer.norm_attn(h)

    @staticmethod
    def finish(layer: GPSLayer, h: Tensor) -> Tensor:
        if not layer.ffn:
            return F.dropout(layer.act(h), layer.dropout, layer.training)
        return layer.norm_ffn(h + layer.feed_forward(h))


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
        if not (layer.branch_residual and layer.ffn and layer.combiner is Parallel):
            raise ValueError(
                "norm_position='pre' needs branch_residual=True, ffn=True and attention_order='parallel' "
                "(a norm before a branch needs a residual stream to leave unnormalised)"
            )

    @staticmethod
    def local(layer: GPSLayer, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> tuple[Tensor, Tensor]:
        h, edges = layer.local_update(layer.norm_local(x), edge_index, edge_attr)
        if layer.local_spec.own_residual:  # built without its residual: edges is its update
            edges = edge_attr + edges
        return h, edges

    @staticmethod
    def attention(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None,
        residual: bool,
    ) -> Tensor:
        return layer.gated(layer.attention_update(layer.norm_attn(x), edge_index, batch, qk_x))

    @staticmethod
    def finish(layer: GPSLayer, h: Tensor) -> Tensor:
        return h + layer.feed_forward(layer.norm_ffn(h))


class Parallel:
    r"""GraphGPS's order: both branches read the layer input and their contributions are summed,
    :math:`\mathbf{h}_L + \mathbf{h}_G`. A gated attention branch adds no residual of its own: the local
    branch carries the input."""

    needs_both = False
    beside = True  # the attention is a branch beside the local one

    @staticmethod
    def first(
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None
    ) -> Tensor:
        """What the branches read: the layer input."""
        return x

    @classmethod
    def combine(
        cls, layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, edge_attr: Tensor | None,
        qk_x: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        """The sum of the branches' contributions (and the stream, under pre-norm), and the edges."""
        placement = layer.placement
        x = cls.first(layer, x, edge_index, batch, qk_x)
        branches = []
        if layer.local is not None:
            h_local, edge_attr = placement.local(layer, x, edge_index, edge_attr)
            branches.append(h_local)
        if layer.attention is not None and cls.beside:
            residual = layer.branch_residual and layer.attention_gate is None
            branches.append(placement.attention(layer, x, edge_index, batch, qk_x, residual))
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
        layer: GPSLayer, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None
    ) -> Tensor:
        """What the local branch reads: the attention's output with its residual."""
        return layer.placement.attention(layer, x, edge_index, batch, qk_x, residual=True)


# ``norm_position`` -> placement, ``attention_order`` -> combiner
NORM_PLACEMENTS: dict[str, type[PostNorm | PreNorm]] = {"post": PostNorm, "pre": PreNorm}
COMBINERS: dict[str, type[Parallel]] = {"parallel": Parallel, "series": Series}
