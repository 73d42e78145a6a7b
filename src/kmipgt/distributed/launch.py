"""The default process group of a training run: joined from torchrun's environment, one rank's place in it."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kmipgt.distributed import group_release  # noqa: F401  (before any process group exists)
from kmipgt.distributed.choices import STRATEGIES

__all__ = [
    "STRATEGIES", "Ranks", "current_ranks", "process_group", "rank_device", "require_torchrun",
    "torchrun_missing",
]

# What torchrun sets for every process it starts (env:// rendezvous of init_process_group).
_TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_missing() -> list[str]:
    """The variables torchrun sets for every process it starts that this process lacks (none: launched by
    torchrun, or an equivalent env:// rendezvous)."""
    return [name for name in _TORCHRUN_VARIABLES if name not in os.environ]


def require_torchrun(command: str) -> None:
    """For a script meant for torchrun: run plainly, it exits with status 2 after one line that gives
    ``command``, how to launch it (torch's own error would name a missing variable instead)."""
    if torchrun_missing():
        print(f"{os.path.basename(sys.argv[0])} runs under torchrun: {command}", file=sys.stderr)
        raise SystemExit(2)


@dataclass(frozen=True)
class Ranks:
    """This process's place in the default process group; rank 0 is the one that writes files."""

    rank: int
    size: int
    local_rank: int

    @property
    def main(self) -> bool:
        return self.rank == 0


def current_ranks() -> Ranks:
    """The place of this process in the initialised default group; ValueError when there is none."""
    if not dist.is_initialized():
        raise ValueError(
            "distributed.strategy 'ddp' or 'graph' needs a torch.distributed process group: launch with "
            "torchrun (`torchrun --nproc-per-node 2 -m kmipgt train ...`) or call init_process_group first"
        )
    return Ranks(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", 0)))


@contextmanager
def process_group(device_type: str) -> Iterator[Ranks]:
    """The default group for the duration of the block: an initialised one as it is, else one joined from
    torchrun's environment (``gloo`` on CPU, ``nccl`` on CUDA), destroyed on leaving the block."""
    if dist.is_initialized():
        yield current_ranks()
        return
    missing = torchrun_missing()
    if missing:
        raise ValueError(
            f"distributed.strategy 'ddp' or 'graph' runs under torchrun (`torchrun --nproc-per-node 2 -m "
            f"kmipgt train ...`), which sets {', '.join(_TORCHRUN_VARIABLES)}; not set here: "
            f"{', '.join(missing)}"
        )
    if device_type == "cuda":
        # NCCL and the object collectives use the current device: each local rank its own GPU.
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo")
    try:
        yield current_ranks()
    finally:
        dist.destroy_process_group()


def rank_device(device: torch.device, ranks: Ranks) -> torch.device:
    """``cuda`` without an index becomes this rank's GPU, ``cuda:LOCAL_RANK``; other devices stay."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", ranks.local_rank)
    return device
