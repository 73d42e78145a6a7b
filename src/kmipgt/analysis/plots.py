"""Pictures of an explanation: attended keys around each chosen query, and hop histograms per layer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import scipy.sparse as sp
from matplotlib.collections import LineCollection
from matplotlib.colors import Normalize

from kmipgt.analysis.hops import HOP_CAP, ball
from kmipgt.atomic import save_figure

__all__ = ["plot_explanation", "plot_stats"]

# Rows (queries) drawn per layer picture; every chosen query is in explain.json regardless.
MAX_DRAWN_QUERIES = 8
NEIGHBOURHOOD_HOPS = 3


class _Layout(NamedTuple):
    """Drawable nodes (sorted ``[M]`` ids), their positions ``[M, 2]`` and the induced edges as one polyline.

    ``edges`` is ``[3E, 2]``: each edge's two ends, then a NaN row that breaks the line. One line with
    breaks draws thousands of edges at once, where a LineCollection builds a Path object per edge
    (measured: most of the time of a 10k-node picture went there).
    """

    nodes: np.ndarray
    pos: np.ndarray
    edges: np.ndarray

    @classmethod
    def of(cls, adjacency: sp.csr_matrix, nodes: np.ndarray, pos: np.ndarray) -> _Layout:
        sub = sp.triu(adjacency[nodes][:, nodes], k=1).tocoo()
        breaks = np.full((sub.row.size, 2), np.nan)
        return cls(nodes, pos, np.stack([pos[sub.row], pos[sub.col], breaks], 1).reshape(-1, 2))

    def at(self, node_ids: list[int]) -> np.ndarray:
        return self.pos[np.searchsorted(self.nodes, node_ids)].reshape(-1, 2)


def _query_layouts(
    explanation: dict[str, Any], adjacency: sp.csr_matrix, coords: np.ndarray | None
) -> dict[int, _Layout]:
    """Per drawn query, the layout of its panels.

    With coordinates: the whole graph where it lies. Without: a spring layout of the query's 3-hop ball
    and every key it has in any layer or head. One layout per query serves every layer picture, so the
    pictures can be compared panel by panel.
    """
    keys: dict[int, set[int]] = {}
    for entry in explanation["layers"]:
        for row in entry["queries"][:MAX_DRAWN_QUERIES]:
            keys.setdefault(row["node"], set()).update(key["node"] for key in row["keys"])
    if coords is not None:
        whole = _Layout.of(adjacency, np.arange(adjacency.shape[0]), coords)
        return dict.fromkeys(keys, whole)
    layouts = {}
    for query, attended in keys.items():
        nodes = np.union1d(ball(adjacency, query, NEIGHBOURHOOD_HOPS), np.fromiter(attended, np.int64))
        layouts[query] = _Layout.of(adjacency, nodes, _spring(adjacency, nodes))
    return layouts


def _spring(adjacency: sp.csr_matrix, nodes: np.ndarray) -> np.ndarray:
    """``[M, 2]`` networkx spring layout of the subgraph induced by ``nodes`` (seeded, so reproducible)."""
    import networkx as nx

    graph = nx.from_scipy_sparse_array(adjacency[nodes][:, nodes])
    layout = nx.spring_layout(graph, seed=0)
    return np.array([layout[i] for i in range(nodes.size)])


def _draw_panel(ax, layout: _Layout, row: dict[str, Any], norm: Normalize) -> None:
    """Faint edges, the query as a star, its keys coloured by weight with lines from the query."""
    ax.plot(layout.edges[:, 0], layout.edges[:, 1], color="0.8", linewidth=0.5)
    origin = layout.at([row["node"]])[0]
    keys = sorted(row["keys"], key=lambda key: key["weight"])  # heaviest drawn last, on top
    points = layout.at([key["node"] for key in keys])
    weights = np.array([key["weight"] for key in keys])
    shade = norm(weights)
    colours = plt.get_cmap("viridis")(shade)
    lines = [[origin, point] for point in points]
    ax.add_collection(LineCollection(lines, colors=colours, linewidths=0.5 + 2 * shade))
    ax.scatter(points[:, 0], points[:, 1], s=25, c=colours, edgecolors="k", linewidths=0.3, zorder=3)
    ax.scatter(*origin, s=160, marker="*", c="red", edgecolors="k", linewidths=0.5, zorder=4)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_aspect("equal", adjustable="datalim")
    ax.autoscale_view()


def _plot_layer(
    path: Path,
    entries: list[dict[str, Any]],
    layouts: dict[int, _Layout],
) -> None:
    """One layer's picture: a row per drawn query, a panel per head (``entries``: that layer's heads, with
    at least one query)."""
    rows = [row["node"] for row in entries[0]["queries"][:MAX_DRAWN_QUERIES]]
    # The colour scale spans the drawn weights: near-uniform weights would otherwise share one colour.
    weights = [key["weight"] for e in entries for r in e["queries"][:MAX_DRAWN_QUERIES] for key in r["keys"]]
    norm = Normalize(min(weights, default=0.0), max(weights, default=1.0))
    fig, axes = plt.subplots(
        len(rows),
        len(entries),
        figsize=(3.2 * len(entries), 3.2 * len(rows)),
        squeeze=False,
        layout="constrained",
    )
    for i, query in enumerate(rows):
        for j, entry in enumerate(entries):
            _draw_panel(axes[i, j], layouts[query], entry["queries"][i], norm)
            axes[i, j].set_title(f"layer {entry['layer']} head {entry['head']}: node {query}", fontsize=8)
    mappable = plt.cm.ScalarMappable(cmap="viridis", norm=norm)
    fig.colorbar(mappable, ax=axes, shrink=0.6, label="attention weight")
    save_figure(fig, path, dpi=80)
    plt.close(fig)


def plot_stats(path: Path, explanation: dict[str, Any]) -> None:
    """Weight-weighted hop histogram per layer (a line per head) next to the MPNN's 1-hop reference (bars)
    and the uniform reference (dashed: k keys drawn at random from the query's graph)."""
    by_layer: dict[int, list[dict[str, Any]]] = {}
    for entry in explanation["layers"]:
        by_layer.setdefault(entry["layer"], []).append(entry)
    fig, axes = plt.subplots(1, len(by_layer), figsize=(4.5 * len(by_layer), 3.2), squeeze=False)
    bins = np.arange(HOP_CAP + 2)
    reference = list(explanation["mpnn_reference"]["hops_histogram"].values())
    uniform = explanation.get("uniform_reference")
    for ax, (layer, entries) in zip(axes[0], sorted(by_layer.items())):
        # Log scale: the MPNN's weight sits in one bin at 1 hop, attention's is spread over dozens.
        ax.set_yscale("log")
        ax.set_ylim(1e-4, 1.5)
        ax.bar(bins, reference, width=1.0, color="0.8", label="MPNN 1-hop")
        if uniform is not None:
            shares = list(uniform["hops_histogram"].values())
            ax.step(bins, shares, where="mid", color="k", linestyle="--", linewidth=1, label="uniform keys")
        for entry in entries:
            ax.step(
                bins,
                list(entry["stats"]["hops_histogram"].values()),
                where="mid",
                label=f"head {entry['head']}",
            )
        ax.set_xticks([0, 16, 32, 48, HOP_CAP + 1], ["0", "16", "32", "48", f">{HOP_CAP}"])
        ax.set(title=f"layer {layer}", xlabel="hops from query to key", ylabel="share of attention weight")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path, dpi=90)
    plt.close(fig)


def plot_explanation(
    out_dir: Path, explanation: dict[str, Any], adjacency: sp.csr_matrix, coords: np.ndarray | None = None
) -> list[Path]:
    """Write ``explain_layer{L}.png`` per layer and ``explain_stats.png``; returns their paths.

    Args:
        out_dir: existing folder.
        explanation: what :func:`kmipgt.analysis.explain` returned.
        adjacency: ``[N, N]`` undirected CSR of the graph (:func:`kmipgt.analysis.undirected_adjacency`).
        coords: ``[N, 2]`` node coordinates, or None for a spring layout of each query's neighbourhood.
    """
    layouts = _query_layouts(explanation, adjacency, coords)
    paths = []
    drawn = {entry["layer"] for entry in explanation["layers"] if entry["queries"]}
    for layer in sorted(drawn):
        path = out_dir / f"explain_layer{layer}.png"
        _plot_layer(path, [e for e in explanation["layers"] if e["layer"] == layer], layouts)
        paths.append(path)
    plot_stats(out_dir / "explain_stats.png", explanation)
    return [*paths, out_dir / "explain_stats.png"]
