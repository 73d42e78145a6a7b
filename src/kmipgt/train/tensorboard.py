"""Optional TensorBoard scalars of a run (``tensorboard: true``): each ``log.csv`` column per epoch.

Needs the ``tensorboard`` package (extra ``kmipgt[tensorboard]``); torch's own ``SummaryWriter`` writes
the event files, so nothing else is added.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

__all__ = ["ScalarWriter", "require_tensorboard"]


def require_tensorboard() -> None:
    """ImportError naming the extra to install when the ``tensorboard`` package is missing.

    Cheap (looks the package up without importing it), so config validation calls it before a run starts.
    """
    if importlib.util.find_spec("tensorboard") is None:
        raise ImportError(
            "config key 'tensorboard' needs the tensorboard package: pip install 'kmipgt[tensorboard]'"
        )


class ScalarWriter:
    """Writes each epoch's ``log.csv`` row to TensorBoard event files in ``log_dir``, one tag per column.

    The step is the row's ``epoch``; empty cells (epochs without evaluation) are skipped.
    """

    def __init__(self, log_dir: Path, first_epoch: int):
        require_tensorboard()
        from torch.utils.tensorboard import SummaryWriter

        # purge_step hides events at or after the first epoch this writer logs: those of epochs a killed
        # run logged before its last checkpoint, and those of a run the directory held before --overwrite.
        self._writer = SummaryWriter(str(log_dir), purge_step=first_epoch)

    def add_row(self, row: dict[str, Any]) -> None:
        """Log ``row``'s values at step ``row["epoch"]`` and flush, so the files keep up with ``last.pt``."""
        for key, value in row.items():
            if key != "epoch" and value is not None:
                self._writer.add_scalar(key, value, global_step=row["epoch"])
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
