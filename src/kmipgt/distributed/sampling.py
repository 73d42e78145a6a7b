"""Which graphs each rank steps through: shuffled training shares and contiguous evaluation shares."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import torch
from torch.utils.data import DistributedSampler, RandomSampler

from kmipgt.distributed.launch import Ranks

__all__ = ["GeneratorDistributedSampler", "evaluation_share", "rank_batch_size"]


class GeneratorDistributedSampler(DistributedSampler):
    """PyTorch's ``DistributedSampler``, its permutation drawn from a given generator.

    The run's data generator is seeded alike on every rank and saved in checkpoints, so every rank draws
    the same permutation, a resumed run draws what the uninterrupted one drew, and global step t covers
    the graphs ``perm[t·B:(t+1)·B]`` that one process with batch size B steps through (rank r takes
    positions r, r + P, ...; the last share is padded with the first graphs, as ``DistributedSampler``
    does, where P does not divide the number of graphs).
    """

    def __init__(self, dataset: Sized, ranks: Ranks, generator: torch.Generator, shuffle: bool = True):
        super().__init__(dataset, num_replicas=ranks.size, rank=ranks.rank, shuffle=shuffle)
        self.generator = generator

    def __iter__(self) -> Iterator[int]:
        # A generator, so the permutation is drawn at the first batch, after the DataLoader has drawn its
        # base seed from the same generator: the order in which one process's RandomSampler draws them.
        n = len(self.dataset)
        # One process's loader samples with RandomSampler: drawing the order through it takes from the
        # generator exactly what that loader takes, so the ranks' epochs match its epochs.
        order = list(RandomSampler(range(n), generator=self.generator)) if self.shuffle else list(range(n))
        order = (order * math.ceil(self.total_size / n))[: self.total_size]
        yield from order[self.rank : self.total_size : self.num_replicas]


def rank_batch_size(batch_size: int, ranks: Ranks) -> int:
    """Graphs per rank and step for a global ``batch_size``; ValueError unless the ranks divide it."""
    if batch_size % ranks.size:
        raise ValueError(
            f"data.batch_size is the global batch: {batch_size} graphs do not split evenly over "
            f"{ranks.size} ranks"
        )
    return batch_size // ranks.size


def evaluation_share(num_items: int, ranks: Ranks) -> range:
    """This rank's contiguous share of ``num_items``: gathered in rank order, the shares are ``0..n``."""
    return range(ranks.rank * num_items // ranks.size, (ranks.rank + 1) * num_items // ranks.size)
