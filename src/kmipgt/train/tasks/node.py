"""The ``node`` task level on one graph: split masks, full batch, optionally training labels as inputs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

import torch
from torch_geometric.data import Data

from kmipgt.train.graph_features import label_columns
from kmipgt.train.tasks.base import SplitGraph, Step, Task, check_split

__all__ = ["NodeTask"]


class NodeTask(Task):
    """``node``: one graph with train/val/test masks, full batch; optionally training labels as inputs."""

    level = "node"

    def train_steps(self, device: torch.device) -> list[Step]:
        graph = self.data.graph.to(device)
        if self.config.task.label_inputs > 0:
            return [Step(*self.hide_labels(graph))]
        return [Step(graph, graph.train_mask)]

    def hide_labels(self, graph: Data) -> tuple[Data, torch.Tensor]:
        """``task.label_inputs``: a copy of ``graph`` showing the labels of a random share of the training
        nodes, and the mask of the other training nodes (those the loss is computed on)."""
        train = graph.train_mask.nonzero().view(-1).cpu()
        order = train[torch.randperm(train.numel(), generator=self.generator)]
        shown = torch.zeros_like(graph.train_mask)
        shown[order[: int(self.config.task.label_inputs * train.numel())].to(shown.device)] = True
        num_classes = self.data.out_channels
        step = graph.clone()
        step.x = torch.cat([graph.x[:, : -(num_classes + 1)], label_columns(graph.y, shown, num_classes)], 1)
        return step, graph.train_mask & ~shown

    def split_outputs(
        self, predict: Callable[[Data], torch.Tensor], splits: Iterable[str], device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        # The splits are masks of one graph: one forward pass scores them all (showing every training
        # label when label_inputs is on).
        graph = self.data.graph.to(device)
        output = predict(graph)
        for split in splits:
            mask = graph[f"{split}_mask"]
            yield split, output[mask], graph.y[mask]

    def token_graph(self) -> Data:
        return self.data.graph

    def split_graph(self, split: str, index: int = 0) -> SplitGraph:
        """The graph and the nodes of ``split``'s mask (there is one graph: ``index`` is not read)."""
        check_split(split)
        graph = self.data.graph
        classes = self.config.task.loss == "cross_entropy" and graph.y.dim() == 1
        return self._split_view(
            graph, graph[f"{split}_mask"].nonzero().flatten(), graph.y if classes else None, graph.train_mask
        )
