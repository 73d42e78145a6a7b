"""``distributed.strategy: graph``: node-level training of one graph whose nodes are split across the ranks.

Each rank holds the whole dataset but trains and scores only its own nodes (a
:class:`~kmipgt.distributed.graph_shard.GraphShard`), running the model through
:class:`~kmipgt.distributed.graph_model.PartitionedGraphTransformer`. Losses and metrics are those of every
rank's nodes together, so the run equals one process on the whole graph.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Iterator

import torch
from torch_geometric.data import Data

from kmipgt.distributed.collect import gather_rows, sum_across_ranks
from kmipgt.distributed.graph_shard import GraphShard, shard_graph
from kmipgt.distributed.launch import Ranks
from kmipgt.distributed.partition import partition_order
from kmipgt.train.config import Config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.graph_features import node_coords
from kmipgt.train.tasks.base import Step
from kmipgt.train.tasks.node import NodeTask

__all__ = ["PartitionedNodeTask", "partition_graph", "rank_share"]


def partition_graph(config: Config, data: PreparedData, ranks: Ranks) -> GraphShard:
    """This rank's share of the run's graph, partitioned as ``distributed.partition`` says."""
    graph = data.graph
    if graph is None:
        raise ValueError(f"distributed.strategy 'graph' partitions one graph; dataset {data.name!r} is a set "
                         "of graphs (use strategy 'none')")
    coords = node_coords(graph, config.model.encoder.coord_columns)
    order, offsets = partition_order(graph.num_nodes, ranks.size, config.distributed.partition, coords)
    return shard_graph(graph, order, offsets, ranks.rank)


def rank_share(loss: torch.Tensor, output: torch.Tensor, count: int) -> torch.Tensor:
    """This rank's term of the mean loss over every rank's ``count`` training nodes (or targets).

    ``loss`` is the mean over this rank's nodes; weighted by their share of all ranks' nodes, the terms
    add up to the global mean, and the parameter gradients summed over ranks are its gradients. A rank
    without training nodes adds zero through ``output``: its backward must still run, since the halo and
    attention exchanges in it need every rank.
    """
    (total,) = sum_across_ranks([count])
    if count == 0:
        return output.sum() * 0.0
    return loss * (count / total)


class PartitionedNodeTask(NodeTask):
    """``node`` under ``strategy: graph``: each rank steps through and scores its own nodes of ``shard``.

    Labels shown as inputs (``task.label_inputs``) are drawn over the whole graph, as one process draws
    them; each split's outputs are gathered from every rank, so every rank scores the whole split.
    """

    def __init__(
        self, config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks, shard: GraphShard
    ):
        super().__init__(config, data, generator, ranks)
        self.shard = shard

    def train_steps(self, device: torch.device) -> list[Step]:
        local = self.shard.graph
        if self.config.task.label_inputs <= 0:
            local = local.to(device)
            return [Step(local, local.train_mask)]
        graph, mask = self.hide_labels(self.data.graph)
        local = copy.copy(local)
        local.x = graph.x[self.shard.nodes]
        return [Step(local.to(device), mask[self.shard.nodes].to(device))]

    def split_outputs(
        self, predict: Callable[[Data], torch.Tensor], splits: Iterable[str], device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        local = self.shard.graph.to(device)
        output = predict(local)
        for split in splits:
            mask = local[f"{split}_mask"]
            yield split, gather_rows(output[mask]), gather_rows(local.y[mask])

    def token_graph(self) -> Data:
        raise ValueError("saving attention tokens is not supported with distributed.strategy 'graph'")
