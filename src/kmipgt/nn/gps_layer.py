"""GraphGPS layer: local message passing and global attention in parallel, then a feed-forward block."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv, GINEConv, SAGEConv

from kmipgt.nn.attention import build_global_attention
from kmipgt.nn.gated_gcn import GatedGCNLayer

LOCAL_KINDS = ("gatedgcn", "gine", "sage", "gcn", "gat", "none")
EDGE_LOCAL_KINDS = ("gatedgcn", "gine")  # the local MPNNs that read edge features
NORM_KINDS = ("layer", "batch")
ATTENTION_ORDERS = ("parallel", "series")
NORM_POSITIONS = ("post", "pre")


def build_norm(kind: str, channels: int) -> torch.nn.Module:
    """Node-wise ``LayerNorm`` (``"layer"``) or ``BatchNorm1d`` (``"batch"``)."""
    if kind == "layer":
        return torch.nn.LayerNorm(channels)
    if kind == "batch":
        return torch.nn.BatchNorm1d(channels)
    raise ValueError(f"norm must be one of {NORM_KINDS}, got {kind!r}")


def build_local_mpnn(
    kind: str, channels: int, dropout: float = 0.0, residual: bool = True
) -> torch.nn.Module | None:
    """GatedGCN (with edge updates), GINE (PyG ``GINEConv``), GraphSAGE (PyG ``SAGEConv``), GCN (PyG
    ``GCNConv``, symmetric normalisation with self-loops), GAT (PyG ``GATConv``, one head, its attention
    coefficients dropped out at ``dropout``, as PyG's ``GAT`` model builds it) or ``None``. ``residual`` is
    GatedGCN's own residual connection; :class:`GPSLayer` adds the others'."""
    if kind == "gatedgcn":
        return GatedGCNLayer(channels, dropout=dropout, residual=residual)
    if kind == "gine":
        mlp = torch.nn.Sequential(
            torch.nn.Linear(channels, channels), torch.nn.ReLU(), torch.nn.Linear(channels, channels)
        )
        return GINEConv(mlp, edge_dim=channels)
    if kind == "sage":
        return SAGEConv(channels, channels)
    if kind == "gcn":
        return GCNConv(channels, channels)
    if kind == "gat":
        return GATConv(channels, channels, dropout=dropout)
    if kind == "none":
        return None
    raise ValueError(f"local MPNN must be one of {LOCAL_KINDS}, got {kind!r}")


class GPSLayer(torch.nn.Module):
    r"""One GraphGPS layer (Rampášek et al., 2022).

    .. math::
        \mathbf{h}_L &= \mathrm{Norm}(\mathbf{h} + \mathrm{Drop}(\mathrm{MPNN}(\mathbf{h}, \mathbf{e}))) \\
        \mathbf{h}_G &= \mathrm{Norm}(\mathbf{h} + \mathrm{Drop}(\mathrm{Attn}(\mathbf{h}))) \\
        \mathbf{h}' &= \mathrm{Norm}(\mathbf{h}_L + \mathbf{h}_G + \mathrm{FFN}(\mathbf{h}_L + \mathbf{h}_G))

    GatedGCN carries its own residual, dropout and edge update (GraphGPS's ``CustomGatedGCN`` wiring);
    GINE keeps the edge features unchanged; GraphSAGE, GCN and GAT ignore them. Either branch may be absent
    (``local="none"`` or ``attention="none"``), but not both.

    With ``attention_gate=True`` (and a local MPNN) the attention enters as a gated residual of the
    local branch instead,

    .. math::
        \mathbf{h}_L + \boldsymbol{\alpha} \odot \mathrm{Drop}(\mathrm{Attn}(\mathbf{h})),

    with a per-channel :math:`\boldsymbol{\alpha}` initialised at zero: at initialisation the layer is
    exactly the MPNN-only layer, and the attention is used only as far as the training signal asks for it.

    ``attention_drop_path`` is stochastic depth of the attention branch, per node (torchvision's
    ``stochastic_depth`` in ``"row"`` mode, a node being a sample): in training each node's attention
    output is dropped with that probability and the others are scaled by :math:`1/(1-p)`, so a dropped
    node's layer is its MPNN branch alone.

    With ``attention_order="series"`` the attention comes first and the rest of the layer is the MPNN-only
    layer on its output, so the MPNN passes on what the attention brought in:
    :math:`\mathbf{h}_A = \mathbf{h} + \boldsymbol{\alpha} \odot \mathrm{Drop}(\mathrm{Attn}(\mathbf{h}))`
    with the gate, else :math:`\mathrm{Norm}(\mathbf{h} + \mathrm{Drop}(\mathrm{Attn}(\mathbf{h})))`,
    whatever ``branch_residual`` says (the layer input must reach the MPNN), then the layer on
    :math:`\mathbf{h}_A` without the attention branch.

    With ``norm_position="pre"`` the norms move onto the branch inputs (pre-norm, as in most
    transformers since GPT-2) and the residual stream is never normalised:

    .. math::
        \mathbf{h} &= \mathbf{x} + \mathrm{Drop}(\mathrm{MPNN}(\mathrm{Norm}(\mathbf{x}), \mathbf{e}))
            + \mathrm{Drop}(\mathrm{Attn}(\mathrm{Norm}'(\mathbf{x}))) \\
        \mathbf{h}' &= \mathbf{h} + \mathrm{FFN}(\mathrm{Norm}''(\mathbf{h}))

    (the attention term times :math:`\boldsymbol{\alpha}` with the gate; GatedGCN's edges become
    :math:`\mathbf{e} + \hat{\mathbf{e}}`). It needs the residuals, the FFN and the parallel order;
    :class:`~kmipgt.nn.model.GraphTransformer` then normalises the last layer's output once.

    With ``branch_residual=False`` the branches drop their ``h +`` (a GCN-style layer replaces each node by
    its aggregate instead of adding to it), and with ``ffn=False`` the layer ends with the activation
    instead of the FFN block, :math:`\mathbf{h}' = \sigma(\mathbf{h}_L + \mathbf{h}_G)`. Both off with
    ``local="gcn"`` make a GCN layer with a global-attention branch beside it (SGFormer's combination).
    ``forward(..., qk_x=...)`` lets the attention's queries and keys come from another input (e.g. the
    positional encodings; build the layer with ``qk_channels``) while its values come from ``x``.

    Args:
        channels: hidden size.
        local: local MPNN kind, one of :data:`LOCAL_KINDS`.
        attention: global attention kind (see :func:`kmipgt.nn.attention.build_global_attention`).
        heads: attention heads.
        dropout: dropout after each branch and inside the FFN.
        attn_dropout: dropout on the attention weights.
        attention_drop_path: probability of dropping a node's attention output (stochastic depth).
        attention_order: ``"parallel"`` (GraphGPS: the attention beside the MPNN) or ``"series"`` (the
            attention, then the MPNN on its output).
        norm_position: ``"post"`` (GraphGPS: each residual sum normalised) or ``"pre"`` (each branch's
            input normalised).
        norm: ``"layer"`` or ``"batch"``.
        activation: FFN activation (``"gelu"`` or ``"relu"``).
        attention_gate: add the attention to the local branch through a zero-initialised gate.
        branch_residual: add the layer input to each branch's output.
        ffn: end with the feed-forward block (else with the activation alone).
        head_dim: attention head size (default ``channels // heads``).
        qk_channels: size of ``qk_x``, when the attention's queries and keys come from it.
        attn_kwargs: options of the attention kind's core (e.g. ``{"k": 16}`` for k-MIP), passed on
            untouched (see :data:`kmipgt.nn.attention.CORES`).
    """

    def __init__(
        self,
        channels: int,
        local: str = "gatedgcn",
        attention: str = "kmip",
        heads: int = 4,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        norm: str = "layer",
        activation: str = "gelu",
        attention_gate: bool = False,
        branch_residual: bool = True,
        ffn: bool = True,
        head_dim: int | None = None,
        qk_channels: int | None = None,
        attn_kwargs: dict[str, Any] | None = None,
        attention_drop_path: float = 0.0,
        attention_order: str = "parallel",
        norm_position: str = "post",
    ):
        super().__init__()
        if activation not in ("gelu", "relu"):
            raise ValueError(f"activation must be 'gelu' or 'relu', got {activation!r}")
        if not 0.0 <= attention_drop_path < 1.0:
            raise ValueError(f"attention_drop_path must be in [0, 1), got {attention_drop_path}")
        if attention_order not in ATTENTION_ORDERS:
            raise ValueError(f"attention_order must be one of {ATTENTION_ORDERS}, got {attention_order!r}")
        _check_norm_position(norm_position, branch_residual, ffn, attention_order)
        self.pre_norm = norm_position == "pre"
        self.channels = channels
        self.local_kind = local
        self.attention_kind = attention
        self.dropout = dropout
        self.attention_drop_path = attention_drop_path
        self.activation = activation
        self.branch_residual = branch_residual
        # Pre-norm adds GatedGCN's residual itself: the layer sees Norm(x), the residual stream x.
        residual = branch_residual and not self.pre_norm
        self.local = build_local_mpnn(local, channels, dropout, residual=residual)
        self.attention = build_global_attention(
            attention,
            channels,
            heads,
            head_dim=head_dim,
            dropout=attn_dropout,
            qk_channels=qk_channels,
            attn_kwargs=attn_kwargs,
        )
        if self.local is None and self.attention is None:
            raise ValueError("GPSLayer needs a local MPNN or a global attention; both are 'none'")
        if attention_gate and (self.local is None or self.attention is None):
            raise ValueError("attention_gate needs both a local MPNN and a global attention")
        if attention_order == "series" and (self.local is None or self.attention is None):
            raise ValueError("attention_order='series' needs both a local MPNN and a global attention")
        self.series = attention_order == "series"
        self.norm_local = build_norm(norm, channels) if self.local is not None else None
        attention_norm = self.attention is not None and (self.pre_norm or not attention_gate)
        self.norm_attn = build_norm(norm, channels) if attention_norm else None
        self.attention_gate = torch.nn.Parameter(torch.zeros(channels)) if attention_gate else None
        self.ffn = ffn
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

    def _mpnn(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> tuple[Tensor, Tensor]:
        """The local MPNN on ``x``: GatedGCN's nodes and edges as it returns them (its residual included
        when built with one), another kind's nodes dropped out and the edges unchanged."""
        if isinstance(self.local, GatedGCNLayer):
            return self.local(x, edge_index, edge_attr)
        args = (edge_attr,) if self.local_kind in EDGE_LOCAL_KINDS else ()
        return self._branch_dropout(self.local(x, edge_index, *args)), edge_attr

    def _local(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> tuple[Tensor, Tensor]:
        h, edge_attr = self._mpnn(x, edge_index, edge_attr)
        if self.branch_residual and not isinstance(self.local, GatedGCNLayer):  # GatedGCN adds its own
            h = x + h
        return self.norm_local(h), edge_attr

    def _branch_dropout(self, h: Tensor) -> Tensor:
        # Without the FFN block the layer drops out once, after its activation, as PyG's BasicGNN does;
        # dropping each branch too would drop the local branch twice per layer.
        return F.dropout(h, self.dropout, self.training) if self.ffn else h

    def _act(self, x: Tensor) -> Tensor:
        return F.gelu(x) if self.activation == "gelu" else F.relu(x)

    def _ffn(self, x: Tensor) -> Tensor:
        h = F.dropout(self._act(self.ffn_in(x)), self.dropout, self.training)
        return F.dropout(self.ffn_out(h), self.dropout, self.training)

    def _attention_output(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None
    ) -> Tensor:
        """The attention branch's output, dropped out and, per node, dropped (stochastic depth)."""
        h = self._branch_dropout(self.attention(x, edge_index, batch, qk_x=qk_x))
        if self.attention_drop_path and self.training:
            h = h * F.dropout(h.new_ones(h.size(0), 1), self.attention_drop_path)
        return h

    def _attention(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None, qk_x: Tensor | None, residual: bool
    ) -> Tensor:
        h = self._attention_output(x, edge_index, batch, qk_x)
        if self.attention_gate is not None:
            return x + self.attention_gate * h if residual else self.attention_gate * h
        return self.norm_attn(x + h if residual else h)

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor,
        batch: Tensor | None = None,
        edge_attr: Tensor | None = None,
        qk_x: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """``x [N, C]``, ``edge_index [2, E]``, ``batch [N]``, ``edge_attr [E, C]``, ``qk_x [N, P]``
        -> (x', edge_attr')."""
        if self.local is not None and edge_attr is None and self.local_kind in EDGE_LOCAL_KINDS:
            raise ValueError(
                f"edge_attr [E, {self.channels}] is required by the local MPNN {self.local_kind!r}"
            )
        if self.pre_norm:
            return self._forward_pre_norm(x, edge_index, batch, edge_attr, qk_x)
        if self.series:
            x = self._attention(x, edge_index, batch, qk_x, residual=True)
        branches = []
        if self.local is not None:
            h_local, edge_attr = self._local(x, edge_index, edge_attr)
            branches.append(h_local)
        if self.attention is not None and not self.series:
            residual = self.branch_residual and self.attention_gate is None
            branches.append(self._attention(x, edge_index, batch, qk_x, residual))
        h = sum(branches)
        if not self.ffn:
            return F.dropout(self._act(h), self.dropout, self.training), edge_attr
        return self.norm_ffn(h + self._ffn(h)), edge_attr

    def _forward_pre_norm(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None, edge_attr: Tensor | None,
        qk_x: Tensor | None,
    ) -> tuple[Tensor, Tensor | None]:
        h = x
        if self.local is not None:
            h_local, edges = self._mpnn(self.norm_local(x), edge_index, edge_attr)
            h = h + h_local
            if isinstance(self.local, GatedGCNLayer):  # built without its residual: edges is its update
                edge_attr = edge_attr + edges
        if self.attention is not None:
            h_attn = self._attention_output(self.norm_attn(x), edge_index, batch, qk_x)
            h = h + (h_attn if self.attention_gate is None else self.attention_gate * h_attn)
        return h + self._ffn(self.norm_ffn(h)), edge_attr

    def __repr__(self) -> str:
        order = ", attention_order='series'" if self.series else ""
        order += ", norm_position='pre'" if self.pre_norm else ""
        return (
            f"{self.__class__.__name__}({self.channels}, local={self.local_kind}, "
            f"attention={self.attention!r}{order})"
        )


def _check_norm_position(norm_position: str, branch_residual: bool, ffn: bool, attention_order: str) -> None:
    if norm_position not in NORM_POSITIONS:
        raise ValueError(f"norm_position must be one of {NORM_POSITIONS}, got {norm_position!r}")
    if norm_position == "pre" and not (branch_residual and ffn and attention_order == "parallel"):
        raise ValueError(
            "norm_position='pre' needs branch_residual=True, ffn=True and attention_order='parallel' "
            "(a norm before a branch needs a residual stream to leave unnormalised)"
        )
