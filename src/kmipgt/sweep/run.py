"""Running a sweep's cells: each in its own ``kmipgt train`` process, finished ones reused, one progress
line per cell, and a results row per cell (a failure stays in its row and its ``error.txt``; a cell stopped
by the time limit, :mod:`kmipgt.sweep.time_limit`, is ``unfinished`` at the epoch it reached)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kmipgt.atomic import atomic_write_text
from kmipgt.child import start_python_module
from kmipgt.sweep.spec import Cell, Sweep, cell_dir, cell_overrides, expand, format_value
from kmipgt.sweep.time_limit import TimeLimit, epochs_done, watch
from kmipgt.train.config import config_differences, config_to_dict, load_config
from kmipgt.train.config_reading import read_yaml
from kmipgt.train.validation import validate_config

METRIC_COLUMNS = ("train", "val", "test", "best_epoch", "epochs", "seconds_per_epoch", "peak_memory_mb",
                  "parameters")
ERROR_TAIL_LINES = 40


def _read_metrics(directory: Path) -> dict[str, Any] | None:
    path = directory / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else None


def check_cells(sweep: Sweep, cells: list[Cell]) -> None:
    """ValueError (or TypeError) naming the first cell whose config is invalid, before any is trained: a bad
    override would otherwise fail every cell, each in its own process."""
    for cell in cells:
        try:
            validate_config(load_config(sweep.base, cell_overrides(sweep, cell)))
        except (ValueError, TypeError) as error:
            raise type(error)(f"cell {cell.label}: {error}") from None


def cell_state(sweep: Sweep, cell: Cell) -> str:
    """``"done"`` (complete ``metrics.json``), ``"resume"`` (a ``last.pt`` only) or ``"new"``."""
    directory = cell_dir(sweep, cell)
    if (_read_metrics(directory) or {}).get("complete"):
        return "done"
    return "resume" if (directory / "last.pt").is_file() else "new"


def _config_changed(sweep: Sweep, cell: Cell) -> bool:
    """Whether a finished cell was trained with another config than the sweep now asks for (out_dir aside).

    Unset ``threads`` matches any count: the run saved the count it resolved it to. Keys the saved config
    lacks (written before they existed) count as their defaults.
    """
    path = cell_dir(sweep, cell) / "config.yaml"
    with open(path) as f:
        saved = read_yaml(f, str(path))
    expected = config_to_dict(load_config(sweep.base, cell_overrides(sweep, cell)))
    if expected["threads"] is None:
        expected["threads"] = saved.get("threads")
    return bool(set(config_differences(saved, expected)) - {"out_dir"})


@dataclass
class Outcome:
    """A cell this run is done with: its results row, wall-clock seconds, whether it was reused from an
    earlier run and, for an unfinished one, the epochs its config asks for."""

    cell: Cell
    row: dict[str, Any]
    seconds: float
    reused: bool
    planned: int | None = None


def _row(cell: Cell, metrics: dict[str, Any] | None, error: str = "", status: str = "") -> dict[str, Any]:
    """The results row of ``cell``: status ``ok``, ``failed`` (``error``) or ``unfinished`` (``metrics``:
    ``{"epochs": the epochs done}``)."""
    row: dict[str, Any] = {"cell": cell.name}
    row.update({key: format_value(value) for key, value in cell.values.items()})
    row["status"] = status or ("failed" if error else "ok")
    row["metric"] = (metrics or {}).get("metric", "")
    row.update({column: (metrics or {}).get(column, "") for column in METRIC_COLUMNS})
    row["error"] = error
    return row


def _unfinished(sweep: Sweep, cell: Cell, seconds: float) -> Outcome:
    """A cell the time limit stopped (or left unstarted): the epochs its ``last.pt`` holds, of how many."""
    row = _row(cell, {"epochs": epochs_done(cell_dir(sweep, cell))}, status="unfinished")
    return Outcome(cell, row, seconds, reused=False, planned=_planned_epochs(sweep, cell))


def _planned_epochs(sweep: Sweep, cell: Cell) -> int:
    return load_config(sweep.base, cell_overrides(sweep, cell)).optim.epochs


def run_cell(sweep: Sweep, cell: Cell, limit: TimeLimit | None = None) -> Outcome:
    """Train one cell in a fresh ``kmipgt train`` process (resuming its ``last.pt``), unless it is done;
    under ``limit`` it is stopped at an epoch boundary in time (:mod:`kmipgt.sweep.time_limit`), or not
    started once the limit is due."""
    directory = cell_dir(sweep, cell)
    state = cell_state(sweep, cell)
    if state == "done":
        if _config_changed(sweep, cell):
            error = f"finished with another config than the sweep's; delete {directory} to train it again"
            return Outcome(cell, _row(cell, None, error), 0.0, reused=True)
        return Outcome(cell, _row(cell, _read_metrics(directory)), 0.0, reused=True)
    if limit is not None and limit.due():
        return _unfinished(sweep, cell, 0.0)
    directory.mkdir(parents=True, exist_ok=True)
    command = ["train", "--config", str(sweep.base), "--no-progress"]
    command += [part for override in cell_overrides(sweep, cell) for part in ("--set", override)]
    # A "new" cell's directory may hold the files of an attempt that failed before its first checkpoint.
    command += ["--resume"] if state == "resume" else ["--overwrite"]
    start = time.monotonic()
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    process = start_python_module("kmipgt", command, **pipes)
    stderr, stopped = watch(process, directory, _planned_epochs(sweep, cell), limit)
    seconds = time.monotonic() - start
    error_file = directory / "error.txt"
    if stopped and not (_read_metrics(directory) or {}).get("complete"):
        return _unfinished(sweep, cell, seconds)
    if process.returncode != 0:
        lines = stderr.splitlines() or [f"exit code {process.returncode}"]
        atomic_write_text(error_file, "\n".join(lines[-ERROR_TAIL_LINES:]) + "\n")
        last = next((line for line in reversed(lines) if line.strip()), f"exit code {process.returncode}")
        return Outcome(cell, _row(cell, None, last.strip()), seconds, reused=False)
    error_file.unlink(missing_ok=True)  # from an earlier failed attempt
    return Outcome(cell, _row(cell, _read_metrics(directory)), seconds, reused=False)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _progress(done: int, total: int, outcome: Outcome, eta: float | None) -> str:
    row = outcome.row
    if row["status"] == "ok":
        result = f"val {row['val']:.3f} test {row['test']:.3f}"
    elif row["status"] == "unfinished":
        result = f"unfinished at epoch {row['epochs']} of {outcome.planned} (time limit)"
    else:
        result = f"FAILED: {row['error']}"
    timing = "done earlier" if outcome.reused else _duration(outcome.seconds)
    line = f"[{done}/{total}] {outcome.cell.label}: {result} ({timing})"
    return line if eta is None or done == total else f"{line} ETA {_duration(eta)}"


def run_sweep(
    sweep: Sweep, jobs: int = 1, echo: Callable[[str], None] = print, limit: TimeLimit | None = None
) -> list[dict[str, Any]]:
    """Run every cell, ``jobs`` at a time (on one device, each in its own process), printing one line per
    cell done; rows in grid order.

    A failing cell keeps its stderr tail in ``cells/<cell>/error.txt`` and its last line in the row's
    ``error``; the other cells still run. Under ``limit`` every cell has stopped by its end, each at an epoch
    boundary it reached in time (:mod:`kmipgt.sweep.time_limit`): its row is ``unfinished`` with the epochs
    done, and running the sweep again resumes it.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    cells = expand(sweep)
    start, trained, outcomes = time.monotonic(), 0, {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads only wait on their cell's process
        futures = [pool.submit(run_cell, sweep, cell, limit) for cell in cells]
        for done, future in enumerate(as_completed(futures), start=1):
            outcome = future.result()
            outcomes[outcome.cell.name] = outcome
            trained += not outcome.reused
            # Wall time per trained cell so far already reflects the parallelism of `jobs`.
            eta = (time.monotonic() - start) / trained * (len(cells) - done) if trained else None
            echo(_progress(done, len(cells), outcome, eta))
    return [outcomes[cell.name].row for cell in cells]
