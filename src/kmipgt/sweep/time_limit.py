"""A sweep's time limit: each running cell stops at an epoch boundary with its ``last.pt``, before the limit.

A cell writes ``last.pt`` and then a row of ``log.csv`` after every epoch (:mod:`kmipgt.train.loop`), both
whole (:mod:`kmipgt.atomic`). The sweep watches each cell's ``log.csv``: when a row comes, more epochs are
due and one as long as the cell's longest so far would end past the limit's interruption point, the cell
is stopped there, at the boundary it has just passed; a cell still busy at the interruption point (its
first epoch, one longer than its others, or its final evaluation) is stopped there and resumes from its
last boundary. A stopped cell gets
SIGTERM and, if still alive at the limit, SIGKILL: its files are whole either way, and its ``last.pt`` is
what ``--resume`` continues from, so the same command run again finishes it with the results of an
uninterrupted run.
"""

from __future__ import annotations

import csv
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["TimeLimit", "epoch_seconds", "epochs_done", "watch"]

# How often a running cell's log is looked at: a stop lands this long after the boundary, at most.
POLL_SECONDS = 0.2
# The interruption point comes this long before the limit (a tenth of the limit where that is less), so
# that an interrupted cell has exited and the reports are written by the limit.
GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class TimeLimit:
    """The moment every cell of a sweep must have stopped, on ``clock`` (seconds, monotonic).

    ``end``: the limit; ``interrupt_at``: the interruption point before it (:data:`GRACE_SECONDS`).
    """

    end: float
    interrupt_at: float
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @classmethod
    def after(cls, seconds: float, clock: Callable[[], float] = time.monotonic) -> TimeLimit:
        """The limit ``seconds`` from now."""
        if not seconds > 0:
            raise ValueError(f"time limit must be a positive number of seconds, got {seconds}")
        now = clock()
        return cls(now + seconds, now + seconds - min(GRACE_SECONDS, seconds / 10), clock)

    def due(self) -> bool:
        """Whether the interruption point has come: no cell may start or go on."""
        return self.clock() >= self.interrupt_at

    def next_epoch_fits(self, epoch_seconds: list[float]) -> bool:
        """Whether an epoch as long as the longest of ``epoch_seconds`` (a cell's epochs so far; none: it
        cannot be told, so it may start) ends before the interruption point."""
        longest = max(epoch_seconds, default=0.0)
        return self.clock() + longest < self.interrupt_at


def epoch_seconds(run_dir: Path) -> list[float]:
    """The seconds of each epoch a run has logged in ``log.csv`` (none before its first epoch)."""
    path = run_dir / "log.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return [float(row["seconds"]) for row in csv.DictReader(handle)]


def epochs_done(run_dir: Path) -> int:
    """The epochs a run has logged: its ``last.pt`` holds at least these."""
    return len(epoch_seconds(run_dir))


def watch(
    process: subprocess.Popen, run_dir: Path, epochs: int, limit: TimeLimit | None
) -> tuple[str, bool]:
    """Wait for a cell's training ``process`` (writing ``run_dir``, ``epochs`` in all), stopping it as the
    module docstring says under ``limit``; its stderr, and whether it was stopped."""
    seen, stopped = 0, False
    while True:
        try:
            return process.communicate(timeout=POLL_SECONDS)[1], stopped
        except subprocess.TimeoutExpired:
            pass  # communicate keeps what was read, and reads on when called again
        if limit is None:
            continue
        if stopped:
            if limit.clock() >= limit.end:
                process.kill()
            continue
        seconds = epoch_seconds(run_dir)
        boundary, seen = len(seconds) > seen, len(seconds)
        if limit.due() or (boundary and seen < epochs and not limit.next_epoch_fits(seconds)):
            process.terminate()
            stopped = True
