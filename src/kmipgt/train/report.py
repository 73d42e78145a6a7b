"""Run reports: the per-epoch CSV log and the learning-curve plots (one run; several runs side by side)."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kmipgt.atomic import atomic_write_text, save_figure


def write_csv(path: Path, history: list[dict[str, Any]]) -> None:
    """One row per epoch; columns from the union of keys in first-seen order, blanks where missing."""
    columns = list(dict.fromkeys(key for row in history for key in row))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(path, text.getvalue())


def plot_curves(path: Path, history: list[dict[str, Any]], metric: str) -> None:
    """Training loss (left) and validation/test ``metric`` (right) against the epoch."""
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(10, 4))
    ax_loss.plot([r["epoch"] for r in history], [r["train_loss"] for r in history])
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="loss")
    evaluated = [r for r in history if r.get("val") is not None]
    for split in ("val", "test"):
        ax_metric.plot([r["epoch"] for r in evaluated], [r[split] for r in evaluated], label=split)
    ax_metric.set(xlabel="epoch", ylabel=metric, title=metric)
    ax_metric.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)


def read_history(run_dir: Path) -> list[dict[str, Any]]:
    """A run's ``log.csv`` as one dict of numbers per epoch (``None`` where the epoch wrote no value, e.g.
    ``val`` between evaluations); FileNotFoundError naming the folder when it has none."""
    path = Path(run_dir) / "log.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no log.csv: not a run directory of kmipgt train")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [{key: None if value == "" else float(value) for key, value in row.items()} for row in rows]


def best_evaluation(history: list[dict[str, Any]], higher_is_better: bool = True) -> dict[str, Any] | None:
    """The row of the first epoch with the best ``val``, as training selects its checkpoint (``None``
    before the first evaluation)."""
    evaluated = [row for row in history if row.get("val") is not None]
    if not evaluated:
        return None
    pick = max if higher_is_better else min
    return pick(evaluated, key=lambda row: row["val"])


def plot_comparison(path: Path, runs: list[tuple[str, list[dict[str, Any]]]], metric: str) -> None:
    """Training loss (left) and validation ``metric`` (right) of several runs against the epoch.

    ``runs``: ``(label, history)`` pairs; runs that share a label (the seeds of one model) share a colour
    and are told apart by line style, so each model reads as one band.
    """
    labels = list(dict.fromkeys(label for label, _ in runs))
    colours = {label: plt.get_cmap("tab10")(i % 10) for i, label in enumerate(labels)}
    styles = ("-", "--", ":", "-.")
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(11, 4))
    seen: dict[str, int] = {}
    for label, history in runs:
        style = styles[seen.get(label, 0) % len(styles)]
        legend = label if label not in seen else None
        seen[label] = seen.get(label, 0) + 1
        ax_loss.plot([r["epoch"] for r in history], [r["train_loss"] for r in history],
                     color=colours[label], linestyle=style, label=legend)
        evaluated = [r for r in history if r.get("val") is not None]
        ax_metric.plot([r["epoch"] for r in evaluated], [r["val"] for r in evaluated],
                       color=colours[label], linestyle=style, marker="o", markersize=3, label=legend)
    ax_loss.set(xlabel="epoch", ylabel="training loss", title="training loss")
    ax_metric.set(xlabel="epoch", ylabel=f"validation {metric}", title=f"validation {metric}")
    ax_metric.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
