"""The ``graph`` task level: many graphs per split in mini-batches, collated on the host or cut from a split
kept on the device, padded to fixed sizes where ``data.pad_to`` asks, shared among ``ddp`` ranks."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch.utils.data import DataLoader as TorchDataLoader
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from kmipgt.distributed.collect import gather_rows
from kmipgt.distributed.launch import Ranks
from kmipgt.distributed.sampling import GeneratorDistributedSampler, evaluation_share, rank_batch_size
from kmipgt.train.batches import batch_to_device
from kmipgt.train.config import Config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.pad_budget import AUTO
from kmipgt.train.padding import PadBudget, fitted_budgets, pad_to_fit, required_budget
from kmipgt.train.resident import ResidentGraphs, graphs_nbytes, resident_by_default
from kmipgt.train.tasks.base import Step, Task

__all__ = ["GraphTask"]

logger = logging.getLogger(__name__)


class GraphTask(Task):
    """``graph``: many graphs per split, in mini-batches of ``data.batch_size``, shuffled for training.

    Under ``ddp`` each rank steps through its share of every global batch and scores a contiguous share of
    each split; the outputs are gathered in rank order, so every rank scores the whole split as one process.
    Batches for a CUDA device are collated into pinned memory and copied without blocking the host. With
    ``data.on_device`` each split is collated once on the device (:class:`ResidentGraphs`) and every batch
    is cut from it: the same graphs in the same order, drawn from the generator as the loader draws them.
    """

    level = "graph"

    def __init__(
        self, config: Config, data: PreparedData, generator: torch.Generator, ranks: Ranks | None = None
    ):
        super().__init__(config, data, generator, ranks)
        self._resident: dict[tuple[str, torch.device], ResidentGraphs | None] = {}
        self._fits: dict[torch.device, bool] = {}
        if config.data.pad_to == AUTO:
            self.pad_budgets = fitted_budgets(self.data.splits.values(), config.data.batch_size)
            logger.info("data.pad_to: auto is %s", ", then ".join(map(str, self.pad_budgets)))
        else:
            budget = PadBudget.from_config(config.data.pad_to)
            self.pad_budgets = () if budget is None else (budget,)
            if budget is not None:
                self._check_budget(budget)

    def _check_budget(self, budget: PadBudget) -> None:
        """ValueError unless every batch of every split fits ``data.pad_to`` (checked once, before training:
        the largest batch shuffling can draw, not the batches of one epoch)."""
        for split, graphs in self.data.splits.items():
            if not graphs:
                continue
            needed = required_budget(graphs, self.config.data.batch_size)
            short = [f"{key} >= {getattr(needed, key)}" for key in ("nodes", "edges", "graphs")
                     if getattr(budget, key) < getattr(needed, key)]
            if short:
                raise ValueError(
                    f"config key 'data.pad_to' is too small for the {split} split's batches of "
                    f"{self.config.data.batch_size} graphs: it needs {', '.join(short)} (its largest graphs, "
                    "plus one padding node and one padding graph)"
                )

    def steps_per_epoch(self) -> int:
        return len(self._loader("train", shuffle=True))

    def train_steps(self, device: torch.device) -> Iterator[Step]:
        return (Step(batch, None) for batch in self._batches("train", True, device))

    def eval_batches(self, split: str) -> DataLoader:
        return self._loader(split, shuffle=False)

    def eval_device_batches(self, split: str, device: torch.device) -> Iterator[Data]:
        """The mini-batches of ``split`` on ``device`` in order, padded to ``data.pad_to`` where it is set."""
        return self._batches(split, False, device)

    def _batches(self, split: str, shuffle: bool, device: torch.device) -> Iterator[Data]:
        """The mini-batches of ``split`` on ``device``: cut from the resident split, or collated on the host
        (into pinned memory for a CUDA device) and copied."""
        budgets = self.pad_budgets
        resident = self._resident_split(split, device)
        if resident is not None:
            batches = (resident.batch(index) for index in self._loader(split, shuffle, indices=True))
            return (pad_to_fit(batch, budgets) for batch in batches) if budgets else batches
        loader = self._loader(split, shuffle, pin_memory=device.type == "cuda")
        if budgets:  # padded on the host, then copied
            return (batch_to_device(pad_to_fit(batch, budgets), device) for batch in loader)
        return (batch_to_device(batch, device) for batch in loader)

    def _resident_split(self, split: str, device: torch.device) -> ResidentGraphs | None:
        """``split`` kept on ``device``, or None where ``data.on_device`` (or its default) keeps it on the
        host. The default keeps it resident only where every split fits (:func:`resident_by_default`) and
        :class:`ResidentGraphs` takes the graphs (tensor attributes alone)."""
        key = (split, device)
        if key in self._resident:
            return self._resident[key]
        graphs = self.data.splits[split]
        choice = self.config.data.on_device
        if choice is None:
            choice = isinstance(graphs, Sequence) and self._all_splits_fit(device)
        try:
            self._resident[key] = ResidentGraphs(graphs, device) if choice else None
        except ValueError:
            if self.config.data.on_device:
                raise
            self._resident[key] = None  # the default: attributes that only the host's collation takes
        return self._resident[key]

    def _all_splits_fit(self, device: torch.device) -> bool:
        # Decided once per device, before a split moves there (the free memory it reads drops afterwards).
        if device not in self._fits:
            splits = self.data.splits.values()
            nbytes = sum(graphs_nbytes(graphs) for graphs in splits if isinstance(graphs, Sequence))
            self._fits[device] = resident_by_default(nbytes, device)
        return self._fits[device]

    def split_outputs(
        self, predict: Callable[[Data], torch.Tensor], splits: Iterable[str], device: torch.device
    ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
        outputs = super().split_outputs(predict, splits, device)
        if self.ranks is None:
            return outputs
        return ((split, gather_rows(output), gather_rows(target)) for split, output, target in outputs)

    def _loader(
        self, split: str, shuffle: bool, indices: bool = False, pin_memory: bool = False
    ) -> TorchDataLoader:
        """The loader of ``split``'s graphs, or with ``indices`` of their indices (``[B]`` tensors): the
        same sampler either way, so both draw the same order from the generator."""
        graphs, batch_size = self.data.splits[split], self.config.data.batch_size
        items: Sequence = range(len(graphs)) if indices else graphs
        kind = TorchDataLoader if indices else DataLoader
        if self.ranks is None:
            generator = self.generator if shuffle else None
            return kind(items, batch_size=batch_size, shuffle=shuffle, generator=generator,
                        pin_memory=pin_memory)
        if shuffle:
            sampler = GeneratorDistributedSampler(items, self.ranks, self.generator)
            # The loader draws its base seed from the same generator, as one process's loader does.
            per_rank = rank_batch_size(batch_size, self.ranks)
            return kind(items, batch_size=per_rank, sampler=sampler, generator=self.generator,
                        pin_memory=pin_memory)
        share = evaluation_share(len(graphs), self.ranks)
        return kind(items[share.start:share.stop], batch_size=batch_size, pin_memory=pin_memory)
