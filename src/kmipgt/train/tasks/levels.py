"""Which task class trains a run's data: its ``task.level`` and whether it is one graph or a set, the config's
level-bound data options (``data.on_device``, ``data.pad_to``) and shape metrics checked against it."""

from __future__ import annotations

import dataclasses

import torch

from kmipgt.distributed.launch import Ranks
from kmipgt.train.config import Config
from kmipgt.train.datasets import PreparedData, prepared_task
from kmipgt.train.segmentation_metrics import SHAPE_METRICS
from kmipgt.train.tasks.base import Task
from kmipgt.train.tasks.graph import GraphTask
from kmipgt.train.tasks.link import LinkTask
from kmipgt.train.tasks.node import NodeTask
from kmipgt.train.tasks.node_batch import NodeBatchTask

__all__ = ["TASK_CLASSES", "make_task"]

# ``task.level`` -> its task class
TASK_CLASSES: dict[str, type[Task]] = {task.level: task for task in (NodeTask, GraphTask, LinkTask)}


def make_task(
    config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks | None = None
) -> Task:
    """The task of ``data.level`` over ``data``, drawing its randomness from ``generator`` (on ``ranks``)."""
    if data.level not in TASK_CLASSES:
        raise ValueError(f"task level must be one of {tuple(TASK_CLASSES)}, got {data.level!r}")
    config = dataclasses.replace(config, task=prepared_task(config, data))
    if config.data.on_device and data.level != "graph":
        raise ValueError(
            f"data.on_device needs a graph-level task (task.level: graph), got task.level {data.level!r}"
        )
    if config.data.pad_to and (data.level != "graph" or data.splits is None):
        raise ValueError(
            f"data.pad_to needs a graph-level task (task.level: graph), got task.level {data.level!r}"
        )
    if data.level == "node" and data.splits is not None:
        return NodeBatchTask(config, data, generator, ranks)
    shapes = [name for name in (config.task.metric, *config.task.report) if name in SHAPE_METRICS]
    if shapes:
        raise ValueError(f"metric {shapes[0]!r} scores shapes: it needs task.level node on a "
                         f"dataset of shapes, got task.level {data.level!r} on {data.name!r}")
    return TASK_CLASSES[data.level](config, data, generator, ranks)
