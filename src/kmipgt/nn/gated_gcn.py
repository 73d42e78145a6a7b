"""Residual gated graph convolution with edge features (Bresson & Laurent, 2017), as used by GraphGPS."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt.nn.activations import relu
from kmipgt.nn.padding import masked_batch_norm
from kmipgt.ops.gated_aggregate import gated_mean


class GatedGCNLayer(torch.nn.Module):
    r"""GatedGCN layer with edge updates, GraphGPS's ``GatedGCNLayer``.

    For an edge :math:`j \to i` with feature :math:`\mathbf{e}_{ij}`:

    .. math::
        \hat{\mathbf{e}}_{ij} &= C\mathbf{e}_{ij} + D\mathbf{h}_i + E\mathbf{h}_j, \qquad
        \sigma_{ij} = \operatorname{sigmoid}(\hat{\mathbf{e}}_{ij}) \\
        \hat{\mathbf{h}}_i &= A\mathbf{h}_i +
        \frac{\sum_{j} \sigma_{ij} \odot B\mathbf{h}_j}{\sum_{j} \sigma_{ij} + \epsilon}

    followed, for nodes and edges alike, by BatchNorm, ReLU, dropout and (optionally) the residual
    :math:`\mathbf{h}_i \leftarrow \mathbf{h}_i + \hat{\mathbf{h}}_i`,
    :math:`\mathbf{e}_{ij} \leftarrow \mathbf{e}_{ij} + \hat{\mathbf{e}}_{ij}`.

    Args:
        channels: node and edge feature size.
        dropout: dropout on the updated node and edge features.
        residual: add the input to the output (nodes and edges).
        node_residual: ``False`` drops the nodes' part of ``residual`` and keeps the edges' (the reference's
            k-MIP models build their GatedGCN so).
    """

    def __init__(
        self, channels: int, dropout: float = 0.0, residual: bool = True, node_residual: bool = True
    ):
        super().__init__()
        self.channels = channels
        self.dropout = dropout
        self.residual = residual
        self.node_residual = node_residual
        self.lin_a, self.lin_b, self.lin_c, self.lin_d, self.lin_e = (
            torch.nn.Linear(channels, channels) for _ in range(5)
        )
        self.norm_node = torch.nn.BatchNorm1d(channels)
        self.norm_edge = torch.nn.BatchNorm1d(channels)

    def reset_parameters(self) -> None:
        for module in (
            self.lin_a,
            self.lin_b,
            self.lin_c,
            self.lin_d,
            self.lin_e,
            self.norm_node,
            self.norm_edge,
        ):
            module.reset_parameters()

    def forward(
        self, x: Tensor | tuple[Tensor, Tensor], edge_index: Tensor, edge_attr: Tensor,
        node_mask: Tensor | None = None, edge_mask: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``x [N, C]``, ``edge_index [2, E]`` (source, target), ``edge_attr [E, C]`` -> (x', edge_attr').

        ``x`` may be a pair ``(x_src [N_src, C], x_dst [N_dst, C])``, as for PyG's bipartite convolutions:
        sources index ``x_src``, targets ``x_dst``, and only the ``N_dst`` targets are updated (so the node
        BatchNorm sees those rows alone, e.g. a graph partition's own nodes without its halo).

        ``node_mask [N_dst]`` / ``edge_mask [E]`` (bool, True: real): in a padded batch, the rows whose
        BatchNorm statistics count (:func:`~kmipgt.nn.padding.masked_batch_norm`); None: every row.
        """
        x_src, x_dst = x if isinstance(x, tuple) else (x, x)
        expected = (edge_index.size(1), self.channels)
        if edge_attr.shape != expected:
            raise ValueError(f"edge_attr must have shape {list(expected)}, got {list(edge_attr.shape)}")
        src, dst = edge_index
        # In place: the gate logits allocate one [E, C] tensor beside the gathered term, not four.
        edge_hat = self.lin_c(edge_attr).add_(self.lin_d(x_dst)[dst]).add_(self.lin_e(x_src)[src])
        x_hat = self.lin_a(x_dst) + gated_mean(edge_hat, self.lin_b(x_src), edge_index, x_dst.size(0))
        x_hat = F.dropout(relu(masked_batch_norm(self.norm_node, x_hat, node_mask)), self.dropout,
                          self.training)
        edge_hat = F.dropout(relu(masked_batch_norm(self.norm_edge, edge_hat, edge_mask)), self.dropout,
                             self.training)
        if not self.residual:
            return x_hat, edge_hat
        return x_dst + x_hat if self.node_residual else x_hat, edge_attr + edge_hat

    def __repr__(self) -> str:
        nodes = "" if self.node_residual else ", node_residual=False"
        return f"{self.__class__.__name__}({self.channels}, residual={self.residual}{nodes})"
