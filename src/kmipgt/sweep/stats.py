"""Statistics of a sweep's results rows: mean and sample std per group of cells, and paired differences of
variants by replicate."""

from __future__ import annotations

import itertools
import math
import statistics
from typing import Any

from kmipgt.sweep.spec import VARIANT_AXIS, condition_axes, replicate_axes

SUMMARY_STATISTICS = ("val", "test", "seconds_per_epoch", "peak_memory_mb")


def _mean_and_std(numbers: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof=1); NaN where there are too few numbers for either."""
    mean = statistics.fmean(numbers) if numbers else math.nan
    return mean, statistics.stdev(numbers) if len(numbers) > 1 else math.nan


def summarize(rows: list[dict[str, Any]], grid_keys: list[str]) -> list[dict[str, Any]]:
    """Per group of cells sharing every grid value but the replicate axes (``seed``, ``data.split_seed``):
    n (finished cells), failed, unfinished (stopped by a time limit), the epochs each cell has done
    (``250/250/87`` in grid order, ``—`` where a row has none: a failed cell), mean and sample standard
    deviation (ddof=1; NaN below two cells) of :data:`SUMMARY_STATISTICS` over the finished cells."""
    group_keys = condition_axes(grid_keys)
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(row[key] for key in group_keys), []).append(row)
    summary = []
    for values, members in groups.items():
        finished = [row for row in members if row["status"] == "ok"]
        entry: dict[str, Any] = dict(zip(group_keys, values, strict=True))
        entry.update(n=len(finished), failed=sum(row["status"] == "failed" for row in members),
                     unfinished=sum(row["status"] == "unfinished" for row in members),
                     epochs="/".join(str(row.get("epochs", "")) or "—" for row in members))
        for name in SUMMARY_STATISTICS:
            numbers = [float(row[name]) for row in finished]
            entry[f"{name}_mean"], entry[f"{name}_std"] = _mean_and_std(numbers)
        summary.append(entry)
    return summary


def paired_differences(rows: list[dict[str, Any]], grid_keys: list[str]) -> list[dict[str, Any]]:
    """Each variant against the first, paired by replicate (the values of ``seed`` and ``data.split_seed``
    that the grid has), within each combination of the other grid axes: n (replicates finished in both),
    mean and sample std (ddof=1; NaN below two) of the val and test differences (this minus the first
    variant), and ``test_higher``, the replicates where this one's test is higher. A pair shares every
    value but the variant.

    Only ``variants`` name what a sweep compares (a grid's first key may be a dataset or generator seed),
    so without a ``variant`` axis, or without a replicate axis, this is empty.
    """
    replicate_keys = replicate_axes(grid_keys)
    if VARIANT_AXIS not in grid_keys or not replicate_keys:
        return []
    context = [key for key in condition_axes(grid_keys) if key != VARIANT_AXIS]
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
