"""Grid sweeps: every combination of config overrides, each cell trained in its own ``kmipgt train`` process.

A sweep file (YAML) names a base config, fixed overrides and a grid of dotted keys; paths in it are relative
to the working directory, like ``kmipgt train --config``::

    base: configs/synthetic_city.yaml
    set: {optim.epochs: 60}
    grid:
      model.attention: [kmip, none]
      seed: [0, 1, 2]
    out: runs/sweeps/city_attention      # default: runs/sweeps/<sweep file stem>

Keys that must change together (attention off *and* the width that matches the parameter count) go into
named ``variants``, a first grid axis called ``variant``::

    variants:
      kmip: {}
      none_same_size: {model.attention: none, model.channels: 92}
    grid:
      seed: [0, 1, 2]

Outputs in ``out``: ``cells/<cell>/`` (each cell's run directory), ``results.csv`` (one row per cell),
``summary.md``, ``summary.csv`` and ``summary.png`` (mean ± sample std over the replicates of each group),
and, with ``variants`` and a replicate axis, ``paired.csv`` (every variant against the first, paired by
replicate), also tabled in ``summary.md``. The replicate axes are ``seed`` (training seed) and
``data.split_seed`` (a redrawn node-level split): a summary averages over them, and a pair shares their
values.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib
import yaml

import kmipgt
from kmipgt.configs import config_path
from kmipgt.train.config import config_differences, config_to_dict, load_config, parse_override

matplotlib.use("Agg")
import matplotlib.pyplot as plt

SWEEP_KEYS = ("base", "set", "variants", "grid", "out")
VARIANT_AXIS = "variant"
REPLICATE_AXES = ("seed", "data.split_seed")  # repeats of one experiment, not conditions to compare
METRIC_COLUMNS = ("train", "val", "test", "best_epoch", "epochs", "seconds_per_epoch", "peak_memory_mb",
                  "parameters")
SUMMARY_STATISTICS = ("val", "test", "seconds_per_epoch", "peak_memory_mb")
ERROR_TAIL_LINES = 40
_MAX_NAME = 150  # cell directory names stay well below the usual 255-byte file-name limit


def format_value(value: Any) -> str:
    """``value`` as ``--set`` reads it back (YAML flow style): ``kmip``, ``1.0e-05``, ``[0, 1]``, ``null``."""
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).removesuffix("\n...\n").strip()


@dataclass
class Sweep:
    """A parsed sweep file: base config, fixed overrides, the grid (dotted key -> values), the output and
    the named variants (name -> overrides that go together)."""

    path: Path
    base: Path
    fixed: dict[str, Any]
    grid: dict[str, list[Any]]
    out: Path
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def axes(self) -> dict[str, list[Any]]:
        """The axes cells combine, in order: ``variant`` (the variants' names) first if there are any, then
        the grid's keys."""
        return {VARIANT_AXIS: list(self.variants), **self.grid} if self.variants else dict(self.grid)

    def group_keys(self) -> list[str]:
        """The axes a summary groups cells by: every one but the replicate axes (:data:`REPLICATE_AXES`)."""
        return _conditions(self.axes())


@dataclass
class Cell:
    """One combination of grid values, with its directory name and its display label."""

    values: dict[str, Any]
    name: str
    label: str


def _conditions(axes: Sequence[str]) -> list[str]:
    """The axes that are conditions to compare: all but :data:`REPLICATE_AXES`, in order."""
    return [key for key in axes if key not in REPLICATE_AXES]


def _replicates(axes: Sequence[str]) -> list[str]:
    """The axes of :data:`REPLICATE_AXES` among ``axes``, in their order."""
    return [key for key in axes if key in REPLICATE_AXES]


def _mapping(value: Any, what: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{what} must be a mapping of dotted config keys, got {value!r}")
    if "out_dir" in value:
        raise ValueError(f"{what} must not set out_dir: each cell runs in OUT/cells/<cell name>")
    return value


def load_sweep(path: str | Path, out: str | Path | None = None, overrides: Sequence[str] = ()) -> Sweep:
    """Read and check a sweep file; ``out`` (e.g. from ``--out``) replaces the file's ``out``, and
    ``overrides`` (``"optim.epochs=20"``, from ``--set``) join or replace its ``set``.

    ``path`` and the file's ``base`` may name shipped configs (``sweeps/influence_of_k``, ``minnesota``).
    """
    path = config_path(path)
    with open(path) as f:
        content = yaml.safe_load(f) or {}
    unknown = sorted(set(content) - set(SWEEP_KEYS))
    if unknown:
        raise ValueError(f"unknown sweep keys {unknown}; known: {list(SWEEP_KEYS)}")
    if "base" not in content:
        raise ValueError(f"sweep {path} needs a base config ('base: configs/....yaml')")
    command_line = _mapping(dict(map(parse_override, overrides)), "--set")
    fixed = {**_mapping(content.get("set") or {}, "set"), **command_line}
    grid = _mapping(content.get("grid") or {}, "grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid key {key!r} needs a non-empty list of values, got {values!r}")
    both = sorted(set(fixed) & set(grid))
    if both:
        raise ValueError(f"keys both fixed by 'set' (or --set) and varied by 'grid': {both}")
    variants = _variants(content.get("variants"), fixed, grid)
    out = Path(out or content.get("out") or Path("runs/sweeps") / path.stem)
    return Sweep(path, config_path(content["base"]), fixed, grid, out, variants)


def _variants(content: Any, fixed: dict[str, Any], grid: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """The ``variants`` mapping, checked: names to overrides that neither ``set`` nor ``grid`` also sets."""
    if content is None:
        return {}
    if not isinstance(content, dict) or not content or not all(isinstance(name, str) for name in content):
        raise ValueError(f"variants must be a non-empty mapping of names to overrides, got {content!r}")
    if VARIANT_AXIS in grid:
        raise ValueError(f"grid key {VARIANT_AXIS!r} is the axis of 'variants'; name the config key in full")
    variants = {name: _mapping(overrides or {}, f"variant {name!r}") for name, overrides in content.items()}
    for name, overrides in variants.items():
        clash = sorted(set(overrides) & (set(fixed) | set(grid)))
        if clash:
            raise ValueError(f"variant {name!r} sets keys that 'set' (or --set) or 'grid' also set: {clash}")
    return variants


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "_"


def _cell_name(values: dict[str, Any]) -> str:
    """``key=value`` parts joined by ``__``, every run of other characters than ``A-Za-z0-9.+-`` -> ``_``."""
    text = "__".join(f"{key}={format_value(value)}" for key, value in values.items()) or "base"
    name = "__".join(f"{_safe(key)}={_safe(format_value(value))}" for key, value in values.items()) or "base"
    if len(name) > _MAX_NAME:  # keep it readable and unique: a prefix plus a hash of the whole
        name = f"{name[:_MAX_NAME - 9]}_{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    return name


def expand(sweep: Sweep) -> list[Cell]:
    """The cartesian product of the axes in file order (the variants first; the last key varies fastest)."""
    cells = []
    axes = sweep.axes()
    for combination in itertools.product(*axes.values()):
        values = dict(zip(axes, combination, strict=True))
        label = " ".join(f"{key}={format_value(value)}" for key, value in values.items()) or "base"
        cells.append(Cell(values, _cell_name(values), label))
    names = [cell.name for cell in cells]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise ValueError(f"grid values give the same cell directory name: {clashes}")
    return cells


def cell_dir(sweep: Sweep, cell: Cell) -> Path:
    return sweep.out / "cells" / cell.name


def cell_overrides(sweep: Sweep, cell: Cell) -> list[str]:
    """The ``key=value`` overrides of one cell: the fixed ones, its variant's, its grid values and its
    ``out_dir``."""
    grid_values = {key: value for key, value in cell.values.items() if key != VARIANT_AXIS}
    variant = sweep.variants[cell.values[VARIANT_AXIS]] if sweep.variants else {}
    values = {**sweep.fixed, **variant, **grid_values, "out_dir": str(cell_dir(sweep, cell))}
    return [f"{key}={format_value(value)}" for key, value in values.items()]


def _read_metrics(directory: Path) -> dict[str, Any] | None:
    path = directory / "metrics.json"
    return json.loads(path.read_text()) if path.is_file() else None


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
    with open(cell_dir(sweep, cell) / "config.yaml") as f:
        saved = yaml.safe_load(f)
    expected = config_to_dict(load_config(sweep.base, cell_overrides(sweep, cell)))
    if expected["threads"] is None:
        expected["threads"] = saved.get("threads")
    return bool(set(config_differences(saved, expected)) - {"out_dir"})


@dataclass
class Outcome:
    """A finished cell: its results row, wall-clock seconds and whether it was reused from an earlier run."""

    cell: Cell
    row: dict[str, Any]
    seconds: float
    reused: bool


def _row(cell: Cell, metrics: dict[str, Any] | None, error: str = "") -> dict[str, Any]:
    row: dict[str, Any] = {"cell": cell.name}
    row.update({key: format_value(value) for key, value in cell.values.items()})
    row["status"] = "failed" if error else "ok"
    row["metric"] = (metrics or {}).get("metric", "")
    row.update({column: (metrics or {}).get(column, "") for column in METRIC_COLUMNS})
    row["error"] = error
    return row


def _child_environment() -> dict[str, str]:
    """This environment with this process's ``kmipgt`` first on the path, so cells run the same code."""
    source = str(Path(kmipgt.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def run_cell(sweep: Sweep, cell: Cell) -> Outcome:
    """Train one cell in a fresh ``kmipgt train`` process (resuming its ``last.pt``), unless it is done."""
    directory = cell_dir(sweep, cell)
    state = cell_state(sweep, cell)
    if state == "done":
        if _config_changed(sweep, cell):
            error = f"finished with another config than the sweep's; delete {directory} to train it again"
            return Outcome(cell, _row(cell, None, error), 0.0, reused=True)
        return Outcome(cell, _row(cell, _read_metrics(directory)), 0.0, reused=True)
    directory.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "kmipgt", "train", "--config", str(sweep.base), "--no-progress"]
    command += [part for override in cell_overrides(sweep, cell) for part in ("--set", override)]
    # A "new" cell's directory may hold the files of an attempt that failed before its first checkpoint.
    command += ["--resume"] if state == "resume" else ["--overwrite"]
    start = time.monotonic()
    process = subprocess.run(command, capture_output=True, text=True, env=_child_environment())
    seconds = time.monotonic() - start
    error_file = directory / "error.txt"
    if process.returncode != 0:
        lines = process.stderr.splitlines() or [f"exit code {process.returncode}"]
        error_file.write_text("\n".join(lines[-ERROR_TAIL_LINES:]) + "\n")
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
    else:
        result = f"FAILED: {row['error']}"
    timing = "done earlier" if outcome.reused else _duration(outcome.seconds)
    line = f"[{done}/{total}] {outcome.cell.label}: {result} ({timing})"
    return line if eta is None or done == total else f"{line} ETA {_duration(eta)}"


def run_sweep(sweep: Sweep, jobs: int = 1, echo: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Run every cell, ``jobs`` at a time, printing one line per finished cell; rows in grid order.

    A failing cell keeps its stderr tail in ``cells/<cell>/error.txt`` and its last line in the row's
    ``error``; the other cells still run.
    """
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    cells = expand(sweep)
    start, trained, outcomes = time.monotonic(), 0, {}
    with ThreadPoolExecutor(max_workers=jobs) as pool:  # threads only wait on their cell's process
        futures = [pool.submit(run_cell, sweep, cell) for cell in cells]
        for done, future in enumerate(as_completed(futures), start=1):
            outcome = future.result()
            outcomes[outcome.cell.name] = outcome
            trained += not outcome.reused
            # Wall time per trained cell so far already reflects the parallelism of `jobs`.
            eta = (time.monotonic() - start) / trained * (len(cells) - done) if trained else None
            echo(_progress(done, len(cells), outcome, eta))
    return [outcomes[cell.name].row for cell in cells]


def write_results(path: Path, rows: list[dict[str, Any]]) -> None:
    """``results.csv``: one row per cell (floats written exactly, so summaries can be recomputed)."""
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def summarize(rows: list[dict[str, Any]], grid_keys: list[str]) -> list[dict[str, Any]]:
    """Per group of cells sharing every grid value but the replicate axes (``seed``, ``data.split_seed``):
    n (finished cells), failed, mean and sample standard deviation (ddof=1; NaN below two cells) of
    :data:`SUMMARY_STATISTICS`."""
    group_keys = _conditions(grid_keys)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[key] for key in group_keys), []).append(row)
    summary = []
    for values, members in groups.items():
        finished = [row for row in members if row["status"] == "ok"]
        entry: dict[str, Any] = dict(zip(group_keys, values, strict=True))
        entry.update(n=len(finished), failed=len(members) - len(finished))
        for name in SUMMARY_STATISTICS:
            numbers = [float(row[name]) for row in finished]
            entry[f"{name}_mean"], entry[f"{name}_std"] = _mean_and_std(numbers)
        summary.append(entry)
    return summary


def _mean_and_std(numbers: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1); NaN where there are too few numbers for either."""
    mean = statistics.fmean(numbers) if numbers else math.nan
    return mean, statistics.stdev(numbers) if len(numbers) > 1 else math.nan


def paired_differences(rows: list[dict[str, Any]], grid_keys: list[str]) -> list[dict[str, Any]]:
    """Each variant against the first, paired by replicate (the values of ``seed`` and ``data.split_seed``
    that the grid has), within each combination of the other grid axes: n (replicates finished in both),
    mean and sample std (ddof=1; NaN below two) of the val and test differences (this minus the first
    variant), and ``test_higher``, the replicates where this one's test is higher. A pair shares every
    value but the variant.

    Only ``variants`` name what a sweep compares (a grid's first key may be a dataset or generator seed),
    so without a ``variant`` axis, or without a replicate axis, this is empty.
    """
    replicate_keys = _replicates(grid_keys)
    if VARIANT_AXIS not in grid_keys or not replicate_keys:
        return []
    context = [key for key in _conditions(grid_keys) if key != VARIANT_AXIS]
    finished: dict[tuple, dict[str, Any]] = {}
    for row in rows:
        if row["status"] == "ok":
            finished[(row[VARIANT_AXIS], *(row[key] for key in [*context, *replicate_keys]))] = row
    values = list(dict.fromkeys(row[VARIANT_AXIS] for row in rows))
    groups = list(dict.fromkeys(tuple(row[key] for key in context) for row in rows))
    replicates = list(dict.fromkeys(tuple(row[key] for key in replicate_keys) for row in rows))
    paired = []
    for group, value in itertools.product(groups, values[1:]):
        keys = [((value, *group, *replicate), (values[0], *group, *replicate)) for replicate in replicates]
        pairs = [(finished[this], finished[that]) for this, that in keys
                 if this in finished and that in finished]
        entry: dict[str, Any] = {VARIANT_AXIS: value, **dict(zip(context, group, strict=True))}
        entry.update(against=values[0], by=" and ".join(replicate_keys), n=len(pairs))
        for name in ("val", "test"):
            diffs = [float(this[name]) - float(that[name]) for this, that in pairs]
            entry[f"{name}_diff_mean"], entry[f"{name}_diff_std"] = _mean_and_std(diffs)
        entry["test_higher"] = sum(float(this["test"]) > float(that["test"]) for this, that in pairs)
        paired.append(entry)
    return paired


def _mean_std(entry: dict[str, Any], name: str, digits: int, sign: str = "") -> str:
    """``mean ± std`` of ``entry``'s ``name``; ``sign="+"`` writes the mean's sign (differences)."""
    mean, std = entry[f"{name}_mean"], entry[f"{name}_std"]
    if math.isnan(mean):
        return "—"
    return f"{mean:{sign}.{digits}f}" if math.isnan(std) else f"{mean:{sign}.{digits}f} ± {std:.{digits}f}"


def _group_label(entry: dict[str, Any], group_keys: list[str]) -> str:
    return " ".join(f"{key}={entry[key]}" for key in group_keys) or "all cells"


def summary_markdown(
    sweep: Sweep, summary: list[dict[str, Any]], metric: str, command: str,
    paired: Sequence[dict[str, Any]] = (),
) -> str:
    """``summary.md``: a table of mean ± sample std (ddof=1) over the finished cells of each group, and the
    ``paired`` differences (:func:`paired_differences`) when there are any."""
    group_keys = sweep.group_keys()
    replicates = _replicates_text(sweep.axes())
    over = f" (over {replicates})" if replicates else ""
    header = [*group_keys, "n", f"val {metric}", f"test {metric}", "s/epoch", "peak memory (MiB)", "failed"]
    lines = [
        f"# Sweep {sweep.path.name}",
        "",
        f"Base config `{sweep.base}`, fixed overrides `{json.dumps(sweep.fixed)}`.",
        *(f"Variant `{name}`: `{json.dumps(overrides)}`." for name, overrides in sweep.variants.items()),
        "Every cell keeps its best-validation checkpoint; test is reported there. Values: mean ± sample "
        f"standard deviation (ddof=1) over the n finished cells of each group{over}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for entry in summary:
        cells = [*(str(entry[key]) for key in group_keys), str(entry["n"]), _mean_std(entry, "val", 4),
                 _mean_std(entry, "test", 4), _mean_std(entry, "seconds_per_epoch", 2),
                 _mean_std(entry, "peak_memory_mb", 0), str(entry["failed"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _paired_markdown(paired, group_keys, metric, replicates)
    lines += ["", "Command:", "", "```", command, "```", ""]
    return "\n".join(lines)


def _replicates_text(axes: Sequence[str]) -> str:
    """The replicate axes of ``axes`` as the reports name them ("`seed` and `data.split_seed`"), or ""."""
    return " and ".join(f"`{key}`" for key in _replicates(axes))


def _paired_markdown(
    paired: Sequence[dict[str, Any]], group_keys: list[str], metric: str, replicates: str,
) -> list[str]:
    """The table of :func:`paired_differences`; its rows carry the summary's ``group_keys``, and
    ``replicates`` names what they are paired by."""
    if not paired:
        return []
    header = [*group_keys, "n", f"val {metric} difference", f"test {metric} difference",
              "pairs with higher test"]
    lines = [
        "",
        f"Paired by {replicates} against {VARIANT_AXIS}={paired[0]['against']} (this minus that; "
        "mean ± sample std over the pairs finished in both):",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for entry in paired:
        differences = [_mean_std(entry, f"{name}_diff", 4, "+") for name in ("val", "test")]
        cells = [*(str(entry[key]) for key in group_keys), str(entry["n"]), *differences,
                 f"{entry['test_higher']} of {entry['n']}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def numeric_axis(summary: list[dict[str, Any]], group_keys: list[str]) -> list[float] | None:
    """The values of the one grid key besides the replicates when all are numbers (a sweep over k, N, ...)."""
    if len(group_keys) != 1:
        return None
    numbers = [_number(entry[group_keys[0]]) for entry in summary]
    return None if None in numbers else numbers


def _number(value: Any) -> float | None:
    """``value`` as a float (rows hold grid values as their text, ``"16"``), or None; booleans are not."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _errors(summary: list[dict[str, Any]], name: str) -> list[float]:
    return [0.0 if math.isnan(entry[f"{name}_std"]) else entry[f"{name}_std"] for entry in summary]


def plot_summary(path: Path, summary: list[dict[str, Any]], group_keys: list[str], metric: str) -> None:
    """Each group's mean test metric with its sample std as error bar: against the grid key when it is
    one numeric key (with seconds per epoch on a second axis), else as bars."""
    means = [entry["test_mean"] for entry in summary]
    axis = numeric_axis(summary, group_keys)
    fig, ax = plt.subplots(figsize=(6.5, 4) if axis else (max(4.0, 1.2 * len(summary) + 1.5), 4))
    if axis:
        order = sorted(range(len(axis)), key=axis.__getitem__)
        x = [axis[i] for i in order]
        ax.errorbar(x, [means[i] for i in order], [_errors(summary, "test")[i] for i in order],
                    marker="o", capsize=4, color="tab:blue")
        if min(x) > 0 and max(x) >= 8 * min(x):
            ax.set_xscale("log", base=2)
        ax.set_xlabel(group_keys[0])
        time = ax.twinx()
        time.errorbar(x, [summary[i]["seconds_per_epoch_mean"] for i in order],
                      [_errors(summary, "seconds_per_epoch")[i] for i in order],
                      marker="s", linestyle="--", capsize=3, color="tab:gray")
        time.set_ylabel("seconds per epoch (dashed)")
    else:
        labels = [_group_label(entry, group_keys).replace(" ", "\n") for entry in summary]
        ax.bar(range(len(summary)), means, yerr=_errors(summary, "test"), capsize=4, color="tab:blue")
        ax.set_xticks(range(len(summary)), labels, fontsize=8, rotation=30, ha="right")
    ax.set(ylabel=f"test {metric}", title=f"test {metric}: mean ± std over replicates")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_reports(sweep: Sweep, rows: list[dict[str, Any]], command: str) -> list[dict[str, Any]]:
    """Write ``results.csv``, ``summary.csv``, ``paired.csv`` (when :func:`paired_differences` gives any),
    ``summary.md`` and ``summary.png``; return the summary."""
    sweep.out.mkdir(parents=True, exist_ok=True)
    write_results(sweep.out / "results.csv", rows)
    summary = summarize(rows, list(sweep.axes()))
    write_results(sweep.out / "summary.csv", summary)
    paired = paired_differences(rows, list(sweep.axes()))
    if paired:
        write_results(sweep.out / "paired.csv", paired)
    metric = next((row["metric"] for row in rows if row["metric"]), "metric")
    (sweep.out / "summary.md").write_text(summary_markdown(sweep, summary, metric, command, paired))
    plot_summary(sweep.out / "summary.png", summary, sweep.group_keys(), metric)
    return summary
