"""PyG's ``GPSConv`` with kmipgt's global attention (k-MIP by default) in its attention step."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import GPSConv, MessagePassing
from torch_geometric.nn.inits import reset

from kmipgt.nn.attention import ProjectedAttention
from kmipgt.nn.attention_kinds import ATTENTION_KINDS

__all__ = ["KMIPGPSConv"]


class KMIPGPSConv(GPSConv):
    r""":class:`torch_geometric.nn.GPSConv` whose global attention is one of kmipgt's kinds, k-MIP by default.

    PyG's ``GPSConv`` runs only its own attention types: assigning another module to ``GPSConv.attn``
    silently skips the attention (its forward dispatches on ``MultiheadAttention`` / ``PerformerAttention``
    and otherwise adds the input to itself). This subclass takes the same arguments, builds
    ``self.attn`` as the attention module of ``attn_type`` on ``channels`` and ``heads`` and runs the same
    layer, with the attention on the ragged batch (no padding to the largest graph):

    .. math::
        \mathbf{h}_L &= \mathrm{Norm}_1(\mathbf{x} + \mathrm{Drop}(\mathrm{MPNN}(\mathbf{x}, \mathbf{A}))) \\
        \mathbf{h}_G &= \mathrm{Norm}_2(\mathbf{x} + \mathrm{Drop}(\mathrm{Attn}(\mathbf{x}))) \\
        \mathbf{x}' &= \mathrm{Norm}_3(\mathbf{h} + \mathrm{MLP}(\mathbf{h})),
        \quad \mathbf{h} = \mathbf{h}_L + \mathbf{h}_G

    Args:
        channels, conv, heads, dropout, act, act_kwargs, norm, norm_kwargs: as in
            :class:`torch_geometric.nn.GPSConv`.
        attn_type: a registered kmipgt attention kind (:mod:`kmipgt.nn.attention_kinds`): ``"kmip"``,
            ``"full"``, ``"performer"`` (kmipgt's FAVOR+ on ragged graphs, not PyG's), ``"grf"``, ...
            (default: :obj:`"kmip"`)
        attn_kwargs: the kind's core options such as ``k`` and ``backend``, and ``head_dim``,
            ``dropout`` (on the attention weights) of its module.

    Example::

        conv = KMIPGPSConv(64, GINConv(mlp), heads=4, attn_kwargs={"k": 16})
        x = conv(x, edge_index, batch)
    """

    def __init__(
        self,
        channels: int,
        conv: MessagePassing | None,
        heads: int = 1,
        dropout: float = 0.0,
        act: str = "relu",
        act_kwargs: dict[str, Any] | None = None,
        norm: str | None = "batch_norm",
        norm_kwargs: dict[str, Any] | None = None,
        attn_type: str = "kmip",
        attn_kwargs: dict[str, Any] | None = None,
    ):
        kinds = ATTENTION_KINDS
        if attn_type not in kinds:
            raise ValueError(f"attn_type must be one of {tuple(kinds)}, got {attn_type!r}")
        # GPSConv builds the MLP and norms around a one-head placeholder attention (so that channels need
        # not divide by heads when head_dim is given), replaced here.
        super().__init__(channels, conv, 1, dropout, act, act_kwargs, norm, norm_kwargs)
        self.heads, self.attn_type = heads, attn_type
        module = kinds[attn_type].module_class or ProjectedAttention
        self.attn = module(channels, heads, attn_type=attn_type, **(attn_kwargs or {}))

    def reset_parameters(self) -> None:
        # GPSConv's own calls the PyTorch-only MultiheadAttention._reset_parameters.
        for child in self.children():
            reset(child)

    def _norm(self, norm: torch.nn.Module | None, x: Tensor, batch: Tensor | None) -> Tensor:
        if norm is None:
            return x
        return norm(x, batch=batch) if self.norm_with_batch else norm(x)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None, **kwargs) -> Tensor:
        """``x [N, channels]``, ``edge_index [2, E]``, sorted ``batch [N]``; ``kwargs`` go to ``conv``."""
        hs = []
        if self.conv is not None:
            h = F.dropout(self.conv(x, edge_index, **kwargs), self.dropout, self.training)
            hs.append(self._norm(self.norm1, h + x, batch))
        h = F.dropout(self.attn(x, edge_index, batch), self.dropout, self.training)
        hs.append(self._norm(self.norm2, h + x, batch))
        out = sum(hs)
        return self._norm(self.norm3, out + self.mlp(out), batch)
