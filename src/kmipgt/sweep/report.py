"""A sweep's reports in its ``out`` folder: ``results.csv`` (one row per cell), ``summary.csv``,
``summary.md`` and ``summary.png`` (mean ± sample std over the replicates of each group) and, with
``variants`` and a replicate axis, ``paired.csv`` (every variant against the first, paired by replicate),
also tabled in ``summary.md``."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kmipgt.atomic import atomic_write_text, save_figure
from kmipgt.sweep.spec import VARIANT_AXIS, Sweep, replicate_axes
from kmipgt.sweep.stats import paired_differences, summarize
from kmipgt.train.report import write_csv


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
    paired: Sequence[dict[str, Any]] = (), unfinished: Sequence[dict[str, Any]] = (),
) -> str:
    """``summary.md``: a table of mean ± sample std (ddof=1) over the finished cells of each group (with the
    epochs each of its cells has done), the
    ``paired`` differences (:func:`~kmipgt.sweep.stats.paired_differences`) when there are any, and the
    ``unfinished`` cells' rows (stopped by a time limit), each with the epoch it reached."""
    group_keys = sweep.group_keys()
    replicates = _replicates_text(sweep.axes())
    over = f" (over {replicates})" if replicates else ""
    header = [*group_keys, "n", f"val {metric}", f"test {metric}", "epochs done", "s/epoch",
              "peak memory (MiB)", "failed", "unfinished"]
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
                 _mean_std(entry, "test", 4), entry["epochs"], _mean_std(entry, "seconds_per_epoch", 2),
                 _mean_std(entry, "peak_memory_mb", 0), str(entry["failed"]), str(entry["unfinished"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += _paired_markdown(paired, group_keys, metric, replicates)
    if unfinished:
        lines += ["", "Unfinished (stopped by the time limit at an epoch boundary; the same command resumes "
                  "them):", ""]
        lines += [f"- `{row['cell']}`: epoch {row['epochs']}" for row in unfinished]
    lines += ["", "Command:", "", "```", command, "```", ""]
    return "\n".join(lines)


def _replicates_text(axes: Sequence[str]) -> str:
    """The replicate axes of ``axes`` as the reports name them ("`seed` and `data.split_seed`"), or ""."""
    return " and ".join(f"`{key}`" for key in replicate_axes(axes))


def _paired_markdown(
    paired: Sequence[dict[str, Any]], group_keys: list[str], metric: str, replicates: str,
) -> list[str]:
    """The table of :func:`~kmipgt.sweep.stats.paired_differences`; its rows carry the summary's
    ``group_keys``, and ``replicates`` names what they are paired by."""
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
    # Imported here, so only a sweep that writes its plot loads matplotlib; a Figure of its own renders
    # with Agg on savefig, leaving the process's pyplot backend alone.
    from matplotlib.figure import Figure

    means = [entry["test_mean"] for entry in summary]
    axis = numeric_axis(summary, group_keys)
    fig = Figure(figsize=(6.5, 4) if axis else (max(4.0, 1.2 * len(summary) + 1.5), 4))
    ax = fig.subplots()
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
    save_figure(fig, path, dpi=100)


def write_reports(sweep: Sweep, rows: list[dict[str, Any]], command: str) -> list[dict[str, Any]]:
    """Write ``results.csv``, ``summary.csv``, ``paired.csv`` (when
    :func:`~kmipgt.sweep.stats.paired_differences` gives any), ``summary.md`` and ``summary.png``; return
    the summary."""
    sweep.out.mkdir(parents=True, exist_ok=True)
    write_csv(sweep.out / "results.csv", rows)
    summary = summarize(rows, list(sweep.axes()))
    write_csv(sweep.out / "summary.csv", summary)
    paired = paired_differences(rows, list(sweep.axes()))
    if paired:
        write_csv(sweep.out / "paired.csv", paired)
    metric = next((row["metric"] for row in rows if row["metric"]), "metric")
    unfinished = [row for row in rows if row["status"] == "unfinished"]
    markdown = summary_markdown(sweep, summary, metric, command, paired, unfinished)
    atomic_write_text(sweep.out / "summary.md", markdown)
    plot_summary(sweep.out / "summary.png", summary, sweep.group_keys(), metric)
    return summary
