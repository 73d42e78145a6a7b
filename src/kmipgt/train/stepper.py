"""A config's model stepped and scored on its task: the model built and wrapped for training, its optimiser
and schedule, one optimiser step, an epoch of steps, and the metrics of each split.

The run around the steps (epochs, best checkpoint, resume, the run directory) is
:class:`~kmipgt.train.loop.Trainer`'s; the benchmarks of a training step (``kmipgt bench step``, ``bench
compile``, ``bench memory``) and the fast dev run step a trainer without running its epochs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.data import Data

from kmipgt.cpus import capped_at_cpus
from kmipgt.distributed.batch_norm import global_batch_norms
from kmipgt.distributed.collect import sum_across_ranks, sum_gradients
from kmipgt.distributed.graph_model import PartitionedGraphTransformer
from kmipgt.distributed.launch import current_ranks, rank_device
from kmipgt.malloc import effective_allocator, release_free_memory
from kmipgt.train.batches import forward
from kmipgt.train.branches import BranchMonitor
from kmipgt.train.compiled import CompiledModel
from kmipgt.train.config import Config
from kmipgt.train.datasets import PreparedData, prepare_data, prepared_task
from kmipgt.train.losses import compute_loss
from kmipgt.train.models import build_model
from kmipgt.train.partitioned import PartitionedNodeTask, partition_graph, rank_share
from kmipgt.train.runtime import compile_failure_hint, resolve_device, seed_everything, warmup_cosine
from kmipgt.train.tasks.base import Step
from kmipgt.train.tasks.levels import make_task

__all__ = ["Stepper"]


class Stepper:
    """``config``'s model on its dataset, with what steps it (optimiser, LR schedule) and scores it.

    With ``distributed.strategy: ddp`` (in an initialised process group, :func:`kmipgt.train.train` joins
    torchrun's) every rank steps a DistributedDataParallel copy on its share of each batch; with ``graph``
    every rank steps on its share of one graph's nodes (:mod:`kmipgt.train.partitioned`). Losses and metrics
    are those of the whole batch, graph and split.
    """

    def __init__(self, config: Config, data: PreparedData | Any = None):
        self.config = config
        strategy = config.distributed.strategy
        self.ranks = current_ranks() if strategy != "none" else None
        self.device = resolve_device(config.device)
        if self.ranks is not None:
            self.device = rank_device(self.device, self.ranks)
        if config.threads is not None:
            if config.threads <= 0:
                raise ValueError(f"threads must be a positive int or null, got {config.threads}")
            torch.set_num_threads(capped_at_cpus(config.threads, "threads"))
        seed_everything(config.seed)
        self.data = data if isinstance(data, PreparedData) else prepare_data(config, data)
        # What the config left open, read from the data.
        config = self.config = dataclasses.replace(config, task=prepared_task(config, self.data))
        seed_everything(config.seed)
        self.model = build_model(config, self.data).to(self.device)
        # Padded batches (data.pad_to) all have one shape: compiled for it, with no symbolic size.
        static = bool(config.data.pad_to)
        self.compiled = (CompiledModel(self.model, dynamic=not static, cuda_graphs=config.optim.cuda_graphs)
                         if config.optim.compile else None)
        # What training steps through: the model (compiled with optim.compile), its DDP wrapper that
        # averages gradients over ranks, or the model on this rank's share of a partitioned graph.
        self.network: torch.nn.Module = self.model if self.compiled is None else self.compiled
        # What evaluation runs: the model itself, except on a partitioned graph (DDP's wrapper would
        # synchronise buffers in every forward, while its ranks evaluate different numbers of batches).
        self.evaluated: torch.nn.Module = self.network
        self.loader_generator = torch.Generator().manual_seed(config.seed)
        self.shard = None  # this rank's share of the graph under strategy graph
        if strategy == "ddp":
            self.model = global_batch_norms(self.model)  # BatchNorm statistics of the global batch
            ids = [self.device.index] if self.device.type == "cuda" else None
            # Some configs leave parameters out of the loss (e.g. the last GatedGCN layer's edge update),
            # which DDP must be told to look for, or its gradient reduction waits for them forever.
            self.network = DistributedDataParallel(self.model, device_ids=ids, find_unused_parameters=True)
        if strategy == "graph":
            self.shard = partition_graph(config, self.data, self.ranks)
            self.network = self.evaluated = PartitionedGraphTransformer(self.model, self.shard.plan)
            self.task = PartitionedNodeTask(config, self.data, self.loader_generator, self.ranks, self.shard)
        else:
            self.task = make_task(config, self.data, self.loader_generator, self.ranks)
        self.steps_per_epoch = self.task.steps_per_epoch()
        opt = config.optim
        # On CUDA one fused kernel updates every parameter (the default, foreach, launches several per step).
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opt.lr, weight_decay=opt.weight_decay,
                                           fused=True if self.device.type == "cuda" else None)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer,
            warmup_cosine(opt.warmup_epochs * self.steps_per_epoch, opt.epochs * self.steps_per_epoch),
        )
        self.branches = BranchMonitor(self.model) if config.log_branches else None
        self._trim = effective_allocator(config.allocator) == "trim"

    def _predict(self, batch: Data, network: torch.nn.Module | None = None) -> torch.Tensor:
        """The output of ``network`` (default: what evaluation runs) in fp32; with ``optim.precision: bf16``
        the forward runs under bf16 autocast (weights, optimiser state and the loss stay fp32)."""
        bf16 = self.config.optim.precision == "bf16"
        with compile_failure_hint(self.config.optim.compile), torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=bf16
        ):
            return forward(self.evaluated if network is None else network, batch).float()

    def _redraw_random_features(self) -> None:
        for module in self.model.modules():
            if hasattr(module, "redraw_projection"):
                module.redraw_projection()

    def _train_epoch(self) -> float:
        """One epoch of optimiser steps; the mean training loss per node, graph or pair (over every rank).

        The loss is summed on the device and read once, at the end of the epoch: a read per step would
        wait for the device at every step.
        """
        self.model.train()
        self._redraw_random_features()
        total: torch.Tensor | float = 0.0
        count = 0
        for step in self.task.train_steps(self.device):
            step_total, step_count = self.train_step(step)
            if step_count:  # a rank of a partitioned graph may have no training nodes (mean: NaN)
                total, count = total + step_total, count + step_count
        total = float(total)
        if self.ranks is not None:
            total, count = sum_across_ranks([total, count])
        return total / count

    def train_step(self, step: Step) -> tuple[torch.Tensor, int]:
        """One optimiser step on ``step``: ``(loss × targets, targets)``, the first a 0-dim tensor on the
        device (not read here, so the host never waits for the step), the second the number of nodes,
        graphs or pairs the loss averaged over."""
        output, target = self.task.loss_inputs(self._predict(step.batch, self.network), step)
        loss = compute_loss(self.config.task.loss, output, target)
        self.optimizer.zero_grad()
        if self.shard is None:
            loss.backward()
        else:
            rank_share(loss, output, target.size(0)).backward()
            sum_gradients(self.model.parameters())
        if self.branches is not None:
            self.branches.record_gradients()
        clip = self.config.optim.grad_clip
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip)
        self.optimizer.step()
        self.scheduler.step()
        if self._trim:
            release_free_memory()
        return loss.detach() * target.size(0), target.size(0)

    @torch.no_grad()
    def evaluate(self, splits: tuple[str, ...] = ("train", "val", "test")) -> dict[str, float]:
        """Metric ``config.task.metric`` on each split, in eval mode, over every node, graph or edge pair."""
        metric = self.config.task.metric
        return self.evaluate_metrics([metric], splits)[metric]

    @torch.no_grad()
    def evaluate_metrics(
        self, names: list[str], splits: tuple[str, ...] = ("train", "val", "test")
    ) -> dict[str, dict[str, float]]:
        """``{metric: {split: value}}`` for each of ``names``, from one evaluation pass over each split
        (:meth:`~kmipgt.train.tasks.base.Task.split_scores`: batch by batch where the task can)."""
        self.model.eval()
        scores: dict[str, dict[str, float]] = {name: {} for name in names}
        for split, values in self.task.split_scores(self._predict, names, splits, self.device):
            for name in names:
                scores[name][split] = values[name]
        return scores
