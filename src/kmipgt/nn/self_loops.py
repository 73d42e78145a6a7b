"""PyG's GCN and GAT layers with their self-loops added in shapes that depend on no value.

``GCNConv`` and ``GATConv`` replace a graph's self-loops by one per node (``add_remaining_self_loops``;
``remove_self_loops`` then ``add_self_loops``), selecting the edges that are no loops with a boolean mask:
an edge count read from the data. Traced, that count is an unbacked size, and inductor fails to generate
code that mixes it with the node count (TorchDynamo traces it; inductor stops at "expected [u1] to have
been codegen-ed"). These layers build the same edge set without a mask: each existing loop ``(i, i)``
becomes an edge ``(i, N)`` into one extra zero row, whose messages, degree and softmax touch no real
node, and a loop ``(i, i)`` is appended for every node::

    E + N edges over N + 1 rows, the output's first N rows kept

For graphs without edge weights (as the local MPNNs are called) the results equal PyG's: GCN's loops
all have weight 1 either way, and GAT's softmax over each node's incoming edges sees the same edges.
The parameters and their names are PyG's.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GCNConv

__all__ = ["StaticLoopGATConv", "StaticLoopGCNConv", "loops_replaced"]


def loops_replaced(edge_index: Tensor, num_src: int, num_dst: int) -> Tensor:
    """``[2, E + min(num_src, num_dst)]`` edges: ``edge_index`` ``[2, E]`` with each self-loop's target
    moved to the extra row ``num_dst``, then a loop on each of the first ``min(num_src, num_dst)`` nodes
    (PyG's count of loops on a bipartite pair)."""
    src, dst = edge_index
    dst = torch.where(src == dst, num_dst, dst)
    loops = torch.arange(min(num_src, num_dst), device=edge_index.device, dtype=edge_index.dtype)
    return torch.cat([torch.stack([src, dst]), loops.expand(2, -1)], dim=1)


def _with_extra_row(x: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor | tuple[Tensor, Tensor], int, int]:
    """``x`` with a zero row appended to its targets, and the source and target counts before it."""
    if isinstance(x, tuple):
        x_src, x_dst = x
        return (x_src, torch.cat([x_dst, x_dst.new_zeros(1, x_dst.shape[1])])), x_src.shape[0], x_dst.shape[0]
    return torch.cat([x, x.new_zeros(1, x.shape[1])]), x.shape[0], x.shape[0]


class StaticLoopGCNConv(GCNConv):
    r"""PyG's :class:`~torch_geometric.nn.conv.GCNConv`,
    :math:`\mathbf{X}' = \hat{\mathbf{D}}^{-1/2} \hat{\mathbf{A}} \hat{\mathbf{D}}^{-1/2} \mathbf{X}
    \mathbf{\Theta}` with :math:`\hat{\mathbf{A}} = \mathbf{A}` with one self-loop per node, its loops built
    in value-independent shapes (module docstring). Takes no edge weights."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs) -> None:
        super().__init__(in_channels, out_channels, add_self_loops=False, **kwargs)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        padded, num_src, num_dst = _with_extra_row(x)
        return super().forward(padded, loops_replaced(edge_index, num_src, num_dst))[:num_dst]


class StaticLoopGATConv(GATConv):
    r"""PyG's :class:`~torch_geometric.nn.conv.GATConv` (attention over each node's incoming edges and one
    self-loop), its loops built in value-independent shapes (module docstring). Takes no edge features."""

    def __init__(self, in_channels: int, out_channels: int, **kwargs) -> None:
        super().__init__(in_channels, out_channels, add_self_loops=False, **kwargs)

    def forward(self, x: Tensor | tuple[Tensor, Tensor], edge_index: Tensor) -> Tensor:
        padded, num_src, num_dst = _with_extra_row(x)
        return super().forward(padded, loops_replaced(edge_index, num_src, num_dst))[:num_dst]
