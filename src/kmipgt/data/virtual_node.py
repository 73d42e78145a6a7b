"""A virtual node joined to every node of a graph: the cheapest global channel, as a control for attention.

PyG's ``VirtualNode`` transform adds the node and the edges; it fills the new node's features and the new
edges' features with zeros, which after z-scoring are indistinguishable from an average atom or bond. So
:func:`add_virtual_node` marks them: one node column (1 on the virtual node) and two edge columns (edges
into it, edges out of it), so a message-passing layer can gate the two directions apart.
"""

from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import VirtualNode

__all__ = ["add_virtual_node", "virtual_node_mask"]


def add_virtual_node(graph: Data, graph_keys: tuple[str, ...] = ("y",)) -> Data:
    """``graph`` with node ``N`` joined to every node ``0..N-1`` by an edge each way, marked.

    Args:
        graph: ``x [N, F]``, ``edge_index [2, E]``, optionally ``edge_attr [E, D]``; node attributes
            (``rwse``, ``lappe``, ...) get a zero row for the virtual node.
        graph_keys: attributes of the whole graph, kept as they are (PyG takes a one-node graph's
            ``[1, C]`` target for a node attribute and would give it a row too).

    Returns:
        A new graph: ``x [N + 1, F + 1]`` (last column: the virtual node), ``edge_index [2, E + 2N]`` (the
        ``E`` edges, then ``i -> N`` for each ``i``, then ``N -> i``), ``edge_attr [E + 2N, D + 2]`` (last
        two columns: into, out of the virtual node; ``[E + 2N, 2]`` when the graph had none).
    """
    num_nodes, num_edges = graph.num_nodes, graph.edge_index.size(1)
    out = VirtualNode()(graph.clone())
    del out.edge_type
    for key in graph_keys:
        if key in graph:
            out[key] = graph[key]
    marked = torch.zeros(num_nodes + 1, 1, dtype=out.x.dtype)
    marked[num_nodes] = 1
    out.x = torch.cat([out.x, marked], 1)
    edge_marks = torch.zeros(num_edges + 2 * num_nodes, 2, dtype=out.x.dtype)
    edge_marks[num_edges : num_edges + num_nodes, 0] = 1
    edge_marks[num_edges + num_nodes :, 1] = 1
    attr = graph.get("edge_attr")
    out.edge_attr = edge_marks if attr is None else torch.cat([out.edge_attr, edge_marks], 1)
    return out


def virtual_node_mask(graph: Data) -> torch.Tensor:
    """``[N]`` bool: the virtual nodes of a graph (or batch) built by :func:`add_virtual_node`, read from
    its marker column (the last of ``x``: exactly 1 on a virtual node, 0 on every other)."""
    return graph.x[:, -1] == 1
