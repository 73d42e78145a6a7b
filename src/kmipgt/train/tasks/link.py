"""The ``edge`` task level: link prediction on one graph, pairs scored against fresh negatives per epoch."""

from __future__ import annotations

import copy

import torch
from torch_geometric.data import Data
from torch_geometric.utils import negative_sampling

from kmipgt.train.tasks.base import Step, Task

__all__ = ["LinkTask", "with_fresh_negatives"]


def with_fresh_negatives(graph: Data) -> Data:
    """A shallow copy of a link-prediction graph scoring its positive pairs against newly sampled non-edges.

    One negative per positive, drawn with PyG's ``negative_sampling`` (Python's RNG, saved in checkpoints)
    among pairs that are not message-passing edges.
    """
    positives = graph.edge_label_index[:, graph.edge_label == 1]
    negatives = negative_sampling(graph.edge_index, graph.num_nodes, num_neg_samples=positives.size(1))
    out = copy.copy(graph)  # new label tensors only; features and encodings stay shared
    out.edge_label_index = torch.cat([positives, negatives], dim=1)
    labels = [positives.new_ones(positives.size(1)), negatives.new_zeros(negatives.size(1))]
    out.edge_label = torch.cat(labels)
    return out


class LinkTask(Task):
    """``edge``: link prediction, full batch; each split's graph scores its ``edge_label_index`` pairs."""

    level = "edge"

    def train_steps(self, device: torch.device) -> list[Step]:
        return [Step(with_fresh_negatives(self.data.splits["train"][0]).to(device), None)]

    def target(self, batch: Data) -> torch.Tensor:
        return batch.edge_label

    def eval_batches(self, split: str) -> list[Data]:
        return self.data.splits[split]
