"""Rank function of tests/distributed/test_group_release.py (spawned ranks import it by name)."""

import os
from pathlib import Path

import torch
import torch.distributed as dist

from kmipgt.distributed import sharded_kmip_attention


def gloo_threads() -> list[str]:
    """Names of this process's threads that gloo started (its pair loop and process-group workers)."""
    tasks = Path("/proc/self/task")
    names = [(tasks / task / "comm").read_text().strip() for task in os.listdir(tasks)]
    return [name for name in names if "gloo" in name]


def group_freed_at_destroy(rank: int, world: int) -> None:
    """After sharded attention (a process's first search imports torch._dynamo, here after the group
    exists, unless an earlier import did) and the example's object all-gather, ``destroy_process_group``
    leaves no gloo thread."""
    query = torch.randn(40, 2, 4, generator=torch.Generator().manual_seed(rank), requires_grad=True)
    sharded_kmip_attention(query, query, query, 3, ptr=torch.tensor([0, 30, 80])).sum().backward()
    dist.all_gather_object([None] * world, rank)
    assert gloo_threads(), "no thread named for gloo: this check could not see a leak"
    dist.destroy_process_group()
    left = gloo_threads()
    assert not left, f"gloo threads outlive destroy_process_group: {left}"
