"""Run a function on spawned ranks of a gloo process group, or the command line under torchrun, failing
(not hanging) when any rank fails.

``torch.multiprocessing.spawn`` ends the other ranks when one fails; :func:`spawn_ranks` then raises
:class:`RanksFailed` with the traceback of every rank that failed (the peers of a failed rank fail too, on
its closed connection, and may be the first ones spawn sees). The process-group timeout bounds a rank
stuck in a collective whose peer died some other way.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

GROUP_TIMEOUT = timedelta(seconds=60)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class RanksFailed(Exception):
    """One or more spawned ranks raised; the message holds each one's traceback, in rank order."""


def _rank_main(
    rank: int, world: int, port: int, cache: str, errors: str, fn: Callable, args: tuple
) -> None:
    os.environ["KMIPGT_CACHE"] = cache  # the test's own cache, as conftest gives every test in-process
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=GROUP_TIMEOUT
    )
    try:
        fn(rank, world, *args)
    except BaseException:
        # Written before this rank exits, hence before its peers can fail on its closed connection.
        (Path(errors) / f"rank{rank}.txt").write_text(f"rank {rank}:\n{traceback.format_exc()}")
        raise
    # Only on success: a failing rank that closed its connections before exiting would let its peers
    # fail on the closed connection first, and spawn would report their error instead of its own.
    if dist.is_initialized():  # ``fn`` may have destroyed it, to check what destroying does
        dist.destroy_process_group()


def spawn_ranks(fn: Callable, world: int, cache: str, *args) -> None:
    """Call ``fn(rank, world, *args)`` on ``world`` gloo ranks (a module-level, picklable ``fn``)."""
    errors = tempfile.mkdtemp()
    try:
        mp.spawn(_rank_main, args=(world, free_port(), cache, errors, fn, args), nprocs=world, join=True)
    except ProcessException as failure:
        reports = [path.read_text() for path in sorted(Path(errors).glob("rank*.txt"))]
        raise RanksFailed("\n".join(reports) or str(failure)) from failure
    finally:
        shutil.rmtree(errors)


def run_torchrun(args: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``torchrun --standalone <args>``; on timeout torchrun is told to stop (SIGTERM: it terminates the ranks
    it started, which run in sessions of their own) and the test fails, so a hung rank never outlives it."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", *args]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with subprocess.Popen(command, env=env, **pipes) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGTERM)
            # The ranks hold the pipes open until torchrun has stopped them.
            _, stderr = process.communicate(timeout=60)
            raise AssertionError(f"torchrun did not finish in {timeout} s:\n{stderr[-3000:]}") from None
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)
