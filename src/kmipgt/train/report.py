"""Run reports: the per-epoch CSV log, the learning-curve plot and the final metrics JSON."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kmipgt.train.atomic import atomic_write, atomic_write_text


def write_csv(path: Path, history: list[dict[str, Any]]) -> None:
    """One row per epoch; columns from the union of keys in first-seen order, blanks where missing."""
    columns = list(dict.fromkeys(key for row in history for key in row))
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=columns)
    writer.writeheader()
    writer.writerows(history)
    atomic_write_text(path, text.getvalue())


def write_json(path: Path, content: dict[str, Any]) -> None:
    """Indented JSON, so the numbers can be read and diffed; written atomically."""
    atomic_write_text(path, json.dumps(content, indent=2) + "\n")


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
    atomic_write(path, lambda f: fig.savefig(f, dpi=100, format="png"))
    plt.close(fig)
