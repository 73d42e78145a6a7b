"""One rank's share of a graph partitioned across ranks: its nodes' rows, the edges ending in them, the halo.

Every rank holds the whole input graph (each loads the dataset) and cuts out its share itself; the cut
needs no communication, since all ranks derive it from the same graph and node order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data

from kmipgt.distributed.halo import HaloPlan, halo_plan

__all__ = ["GraphShard", "shard_graph"]


@dataclass(frozen=True)
class GraphShard:
    """Rank ``plan.rank``'s share of a partitioned graph.

    ``nodes``: ``[n_r]`` the graph's ids of this rank's nodes, in row order. ``graph``: their node attributes
    (rows of ``nodes``), the edges ending in them with their attributes, ``edge_index`` numbered in the
    rows ``[own nodes; halo]`` (:class:`~kmipgt.distributed.HaloPlan`), and the graph-level attributes.
    ``offsets``: ``[P + 1]`` row offsets of every rank's nodes in the partition's order.
    """

    nodes: Tensor
    graph: Data
    plan: HaloPlan
    offsets: list[int]


def shard_graph(graph: Data, order: Tensor, offsets: list[int], rank: int) -> GraphShard:
    """Rank ``rank``'s share of ``graph`` for the node ``order`` ``[N]`` split at ``offsets`` ``[P + 1]``."""
    position = torch.empty_like(order)
    position[order] = torch.arange(order.numel())
    plan = halo_plan(position[graph.edge_index.cpu()], offsets, rank)
    nodes = order[offsets[rank]:offsets[rank + 1]]
    local = Data(edge_index=plan.edge_index.to(graph.edge_index.device), num_nodes=nodes.numel())
    for key, value in graph.items():
        if key in ("edge_index", "num_nodes"):
            continue
        if graph.is_node_attr(key):
            local[key] = value[nodes.to(value.device)]
        elif graph.is_edge_attr(key):
            local[key] = value[plan.edge_ids.to(value.device)]
        else:
            local[key] = value
    return GraphShard(nodes, local, plan, offsets)
