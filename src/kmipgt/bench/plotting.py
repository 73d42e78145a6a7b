"""Log-log plots of benchmark records: one line per series, one panel per measured quantity."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from kmipgt.atomic import save_figure

__all__ = ["plot_scaling"]


def plot_scaling(
    records: Sequence[dict],
    series: Callable[[dict], str],
    panels: Sequence[tuple[str, str, float]],
    path: Path,
    title: str,
) -> None:
    """Plot ``record[field] * factor`` against ``record["n"]`` for every ``(field, label, factor)`` panel.

    Only records with ``status == "ok"`` are drawn; ``series(record)`` names the line a record joins.
    """
    lines: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if record.get("status") == "ok":
            lines[series(record)].append(record)
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    for axis, (field, label, factor) in zip(axes[0], panels):
        # One colour per series in every panel, also where a series lacks this panel's field.
        for colour, (name, points) in enumerate(sorted(lines.items())):
            # A zero (e.g. no RSS growth at tiny N) has no place on a log axis; a series may lack a field.
            points = sorted((p for p in points if p.get(field, 0) > 0), key=lambda record: record["n"])
            if not points:
                continue
            axis.plot(
                [p["n"] for p in points],
                [p[field] * factor for p in points],
                marker="o",
                label=name,
                color=f"C{colour % 10}",
            )
        axis.set(xscale="log", yscale="log", xlabel="N (nodes per graph)", ylabel=label)
        axis.grid(True, which="both", alpha=0.3)
    if lines:
        axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    plt.close(fig)
