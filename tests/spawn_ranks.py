"""Run a function on a few spawned ranks of a gloo process group, failing (not hanging) when any rank fails.

``torch.multiprocessing.spawn`` ends the other ranks and raises the failing rank's error (with its
traceback) in the caller; the process-group timeout bounds a rank stuck in a collective whose peer
died some other way.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

GROUP_TIMEOUT = timedelta(seconds=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(rank: int, world: int, port: int, cache: str, fn: Callable, args: tuple) -> None:
    os.environ["KMIPGT_CACHE"] = cache  # the test's own cache, as conftest gives every test in-process
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=GROUP_TIMEOUT
    )
    fn(rank, world, *args)
    # Only on success: a failing rank that closed its connections before exiting would let its peers
    # fail on the closed connection first, and spawn would report their error instead of its own.
    dist.destroy_process_group()


def spawn_ranks(fn: Callable, world: int, cache: str, *args) -> None:
    """Call ``fn(rank, world, *args)`` on ``world`` gloo ranks (a module-level, picklable ``fn``)."""
    mp.spawn(_rank_main, args=(world, free_port(), cache, fn, args), nprocs=world, join=True)
