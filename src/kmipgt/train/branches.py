"""Per-layer scale of the two GPS branches during training: what each adds to the residual stream, and how
much gradient it receives.

An attention branch that the optimiser silences (output scale falling towards zero next to the MPNN's) or
one that dominates from the start looks the same in a loss curve; these numbers tell them apart
(``log_branches: true`` in a run's config, columns ``L{i}_{local,attn}_{out,grad}`` of ``log.csv`` and
``branches.png``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib
import torch

from kmipgt.atomic import save_figure
from kmipgt.nn.gps_layer import GPSLayer

matplotlib.use("Agg")
import matplotlib.pyplot as plt

BRANCHES = ("local", "attn")


def _rms(tensor: torch.Tensor) -> float:
    return float(tensor.detach().float().pow(2).mean().sqrt())


def _grad_norm(parameters: list[torch.nn.Parameter]) -> float:
    grads = [p.grad.detach().float() for p in parameters if p.grad is not None]
    return math.sqrt(sum(float(g.pow(2).sum()) for g in grads)) if grads else 0.0


class BranchMonitor:
    """Records, for every :class:`GPSLayer` of ``model``, the RMS of each branch's contribution and the norm
    of the gradient on each branch's parameters, averaged over the training steps of an epoch.

    The local contribution is the MPNN's update before the residual (a kind that carries its own residual,
    GatedGCN, has its input subtracted when it adds one); the attention contribution is the attention
    module's output before dropout and the residual (or gate). Gradient norms are taken before clipping.
    Evaluation passes are not recorded.
    """

    def __init__(self, model: torch.nn.Module):
        self.layers = [m for m in model.modules() if isinstance(m, GPSLayer)]
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)
        self._handles = []
        for index, layer in enumerate(self.layers):
            for branch, module in (("local", layer.local), ("attn", layer.attention)):
                if module is not None:
                    # An own-residual MPNN returns (x', e') and is built with its residual where the layer
                    # has residuals and does not add them itself (post-norm).
                    own = branch == "local" and layer.local_spec.own_residual
                    residual = layer.branch_residual and layer.local_residual
                    adds_input = own and residual and not layer.placement.stream
                    hook = self._output_hook(index, branch, own, adds_input)
                    self._handles.append(module.register_forward_hook(hook))

    def _add(self, key: str, value: float) -> None:
        self._sums[key] += value
        self._counts[key] += 1

    def _output_hook(self, index: int, branch: str, pair: bool, adds_input: bool):
        def hook(module, args, output):
            # Activation checkpointing reruns this forward during backward, with the same dropout masks:
            # the repeat adds the same value again and leaves the mean unchanged.
            if not module.training:
                return
            if pair:
                output = output[0] - args[0] if adds_input else output[0]
            self._add(f"L{index}_{branch}_out", _rms(output))

        return hook

    def record_gradients(self) -> None:
        """Call after ``backward()`` and before clipping."""
        for index, layer in enumerate(self.layers):
            for branch, module in (("local", layer.local), ("attn", layer.attention)):
                if module is not None:
                    self._add(f"L{index}_{branch}_grad", _grad_norm(list(module.parameters())))

    def epoch_row(self) -> dict[str, float]:
        """Means since the last call, then reset."""
        row = {key: self._sums[key] / self._counts[key] for key in sorted(self._sums, key=_column_order)}
        self._sums.clear()
        self._counts.clear()
        return row

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _column_order(key: str) -> tuple[int, str, str]:
    layer, branch, what = key.split("_")
    return int(layer[1:]), what, branch


def plot_branches(path: Path, history: list[dict[str, Any]]) -> None:
    """Output RMS (left) and gradient norm (right) of each branch against the epoch, one line per layer
    and branch (local solid, attention dashed)."""
    layers = sorted({int(key.split("_")[0][1:]) for row in history for key in row if key.endswith("_out")})
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = plt.get_cmap("viridis")
    labels = ("branch output RMS", "gradient norm (before clipping)")
    for ax, what, label in zip(axes, ("out", "grad"), labels):
        for layer in layers:
            colour = colours(layer / max(len(layers) - 1, 1))
            for branch, style in zip(BRANCHES, ("-", "--")):
                key = f"L{layer}_{branch}_{what}"
                points = [(row["epoch"], row[key]) for row in history if row.get(key) is not None]
                if points:
                    ax.plot(*zip(*points), style, color=colour, label=f"layer {layer} {branch}")
        ax.set(xlabel="epoch", ylabel=label, yscale="log", title=label)
    axes[1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    save_figure(fig, path, dpi=100)
    plt.close(fig)
