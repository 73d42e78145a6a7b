"""The ``node`` task level over a set of graphs (inductive segmentation): mini-batches, a label per node."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch_geometric.data import Data

from kmipgt.distributed.launch import Ranks
from kmipgt.train.config import Config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.metric_accumulators import SplitScores, accumulates
from kmipgt.train.segmentation_metrics import shape_parts
from kmipgt.train.tasks.graph import GraphTask

__all__ = ["NodeBatchTask"]


class NodeBatchTask(GraphTask):
    """``node`` over a set of graphs (inductive segmentation): :class:`GraphTask`'s mini-batches, with the
    model predicting every node and the loss and metrics taken over every node of a split's graphs.

    The shape metrics (``instance_miou``, ``class_miou``) score each graph as a shape of its ``category``
    over that category's parts (:func:`~kmipgt.train.segmentation_metrics.shape_parts`), batch by batch.
    """

    level = "node"

    def __init__(
        self, config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks | None = None
    ):
        super().__init__(config, data, generator, ranks)
        metrics = (config.task.metric, *config.task.report)
        self._category_parts = shape_parts(metrics, data.name, data.splits["train"][0])

    def split_scores(self, predict: Callable[[Data], torch.Tensor], names: Sequence[str],
                     splits: Iterable[str], device: torch.device) -> Iterator[tuple[str, dict[str, float]]]:
        """Class-id metrics summed batch by batch (:class:`SplitScores`), others as :class:`Task` does."""
        if self.config.task.loss != "cross_entropy" or not accumulates(names, self._category_parts):
            yield from super().split_scores(predict, names, splits, device)
            return
        for split in splits:
            scores = SplitScores(names, self.data.out_channels, self._category_parts)
            for batch in self.eval_device_batches(split, device):
                scores.add(predict(batch), self.target(batch), batch)
            yield split, scores.values(self.ranks)
