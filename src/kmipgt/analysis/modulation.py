"""The modulation functions f that a model's GRF attention layers learned, next to where they started."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch import Tensor

from kmipgt.atomic import save_figure
from kmipgt.nn.grf_core import GRFCore

__all__ = ["Modulation", "modulations", "plot_modulations"]


@dataclass(frozen=True)
class Modulation:
    """One GRF attention layer's modulation function.

    Attributes:
        name: the layer, e.g. ``"layer 6"`` (the module path where it does not name a layer).
        learned: ``[H, T + 1]`` f of every head, ``f_t`` weighting walks of ``t`` steps.
        initial: ``[T + 1]`` the f every head started from.
    """

    name: str
    learned: Tensor
    initial: Tensor


def _layer_name(path: str) -> str:
    match = re.match(r"layers\.(\d+)\.", path)
    return f"layer {match.group(1)}" if match else path


def modulations(model: torch.nn.Module) -> list[Modulation]:
    """The modulation of every GRF attention core of ``model``, in module order.

    Raises ValueError when the model has none (its attention kind is not ``grf``).
    """
    found = [
        Modulation(_layer_name(path), core.f.detach().float().cpu(), core.initial_f())
        for path, core in model.named_modules()
        if isinstance(core, GRFCore)
    ]
    if not found:
        raise ValueError("the model has no GRF attention layer (model.attention.kind must be 'grf')")
    return found


def plot_modulations(path: Path, runs: dict[str, list[Modulation]]) -> None:
    """One panel per layer: f of every head of every run (one colour per run), the initial f dashed.

    Args:
        path: the PNG to write.
        runs: each run's label and :func:`modulations`; the runs must have the same layers.
    """
    if not runs:
        raise ValueError("`runs` is empty: give at least one run's modulations")
    layers = [[m.name for m in found] for found in runs.values()]
    if any(names != layers[0] for names in layers):
        raise ValueError(f"the runs have different GRF layers: {layers}")
    columns = min(4, len(layers[0]))
    rows = -(-len(layers[0]) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(3.2 * columns, 2.6 * rows), squeeze=False,
                                sharex=True, sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, ax in enumerate(axes.flat):
        if index >= len(layers[0]):
            ax.set_visible(False)
            continue
        for run_index, (label, found) in enumerate(runs.items()):
            layer = found[index]
            steps = torch.arange(layer.learned.shape[1])
            colour = colours[run_index % len(colours)]
            for head, f in enumerate(layer.learned):
                ax.plot(steps, f, color=colour, linewidth=1.0, marker=".",
                        label=label if head == 0 else None)
        first = next(iter(runs.values()))[index]
        ax.plot(torch.arange(first.initial.numel()), first.initial, "k--", linewidth=1.2, label="initial")
        ax.set_title(first.name)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("walk step t")
    for ax in axes[:, 0]:
        ax.set_ylabel("f_t")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    # Below the panels, so that no curve is hidden behind it.
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), fontsize=7, frameon=False)
    figure.tight_layout(rect=(0, 0.06 + 0.03 * ((len(labels) - 1) // 4), 1, 1))
    save_figure(figure, path)
    plt.close(figure)
