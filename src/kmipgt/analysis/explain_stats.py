"""Statistics of attended keys over a split's queries: per-head accumulators of hops, labels, entropy and
distinct keys, the graph context they read, the MPNN 1-hop and uniform references, and summary rows.

:mod:`kmipgt.analysis.explain` feeds them each layer's selection, chunk by chunk; the references are the
figures of an attention that reads only the 1-hop neighbours, or that chooses its keys blindly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data

from kmipgt.analysis.hops import HOP_CAP, hop_distances, undirected_adjacency
from kmipgt.data import virtual_node_mask
from kmipgt.ops import AttentionSelection

__all__ = [
    "CHUNK",
    "HOP_LABELS",
    "Accumulator",
    "Context",
    "add_mpnn_reference",
    "add_uniform_reference",
    "chunks",
    "graph_context",
    "key_hops",
    "query_rows",
    "share_beyond",
    "summary_rows",
]

# Queries per statistics chunk: bounds the [chunk, H, k] gathers and the hop search's working set.
CHUNK = 4096
HOP_LABELS = [*(str(h) for h in range(HOP_CAP + 1)), f">{HOP_CAP}"]


@dataclass
class Accumulator:
    """Weighted sums over the queries seen so far, per head, from which :meth:`stats` are read."""

    heads: int
    histogram: Tensor = field(init=False)
    sums: dict[str, Tensor] = field(init=False)
    received: Tensor = field(init=False)
    distinct: Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.histogram = torch.zeros(self.heads, HOP_CAP + 2, dtype=torch.float64)
        names = ("weight", "hops", "reachable", "train", "same", "entropy", "queries", "mass", "virtual")
        self.sums = {name: torch.zeros(self.heads, dtype=torch.float64) for name in names}
        self.received = torch.zeros(self.heads, 0, dtype=torch.bool)
        self.distinct = torch.zeros(self.heads, dtype=torch.long)

    def start_graph(self, num_nodes: int) -> None:
        """Queries of a new (batch of) graph(s) follow: distinct keys so far are counted and reset."""
        self.distinct += self.received.sum(1)
        self.received = torch.zeros(self.heads, num_nodes, dtype=torch.bool)

    def add(self, sources: Tensor, selection: AttentionSelection, hops: Tensor, context: Context) -> None:
        """Fold in ``[C]`` queries: selection ``[C, H, k]`` and their key hops ``[C, H, k]`` (-1: > cap)."""
        weight = selection.weight.double() * (selection.index >= 0)
        index = selection.index.clamp(min=0)
        sums = self.sums
        # A virtual node is no place in the graph: its weight is counted apart, not binned by hops.
        on_graph = weight
        if context.virtual is not None:
            on_virtual = weight * context.virtual[index]
            sums["virtual"] += on_virtual.sum((0, 2))
            on_graph = weight - on_virtual
        bins = torch.where(hops < 0, HOP_CAP + 1, hops) + (HOP_CAP + 2) * torch.arange(self.heads)[:, None]
        self.histogram += torch.bincount(
            bins.flatten(), on_graph.flatten(), minlength=self.heads * (HOP_CAP + 2)
        ).view(self.heads, -1)
        reachable = on_graph * (hops >= 0)
        sums["weight"] += weight.sum((0, 2))
        sums["hops"] += (reachable * hops.clamp(min=0)).sum((0, 2))
        sums["reachable"] += reachable.sum((0, 2))
        sums["entropy"] += torch.special.entr(weight).sum((0, 2))
        sums["queries"] += (weight.sum(-1) > 0).sum(0)
        if context.train is not None:
            sums["train"] += (weight * context.train[index]).sum((0, 2))
        if context.labels is not None:
            same = context.labels[index] == context.labels[sources][:, None, None]
            sums["same"] += (weight * same).sum((0, 2))
        if selection.mass is not None:
            sums["mass"] += selection.mass.double().sum(0)
        heads = torch.arange(self.heads)[None, :, None].expand_as(index)
        self.received[heads[on_graph > 0], index[on_graph > 0]] = True

    def stats(self, head: int, context: Context, mass: bool = False) -> dict[str, Any]:
        """The statistics of one head (see :func:`explain`)."""
        sums = {name: float(value[head]) for name, value in self.sums.items()}
        total = sums["weight"]
        binned = self.histogram[head] / max(total - sums["virtual"], 1e-300)
        out: dict[str, Any] = {
            "hops_histogram": dict(zip(HOP_LABELS, binned.tolist())),
            "mean_hops": sums["hops"] / sums["reachable"] if sums["reachable"] > 0 else None,
            "weight_on_train": sums["train"] / total if context.train is not None and total else None,
            "same_label_rate": sums["same"] / total if context.labels is not None and total else None,
            "base_same_label_rate": context.base_same_label_rate,
            "entropy": sums["entropy"] / sums["queries"] if sums["queries"] else None,
            "distinct_keys": int(self.distinct[head] + self.received[head].sum()),
            "queries": int(sums["queries"]),
            "weight_on_virtual_node": (
                sums["virtual"] / total if context.virtual is not None and total else None
            ),
        }
        if mass:
            out["mean_mass"] = sums["mass"] / sums["queries"] if sums["queries"] else None
        return out


@dataclass
class Context:
    """What every statistic needs about the graph: adjacency, labels, training nodes, split nodes, which
    graph of a batch each node belongs to (``owner`` ``[N]``, ``ptr`` ``[G + 1]`` first nodes), and the
    virtual nodes (``virtual`` ``[N]`` bool, the last node of each graph; ``None`` without them)."""

    adjacency: sp.csr_matrix
    split_nodes: Tensor
    labels: Tensor | None
    train: Tensor | None
    base_same_label_rate: float | None
    owner: Tensor
    ptr: Tensor
    virtual: Tensor | None = None


def graph_context(
    graph: Data, split_nodes: Tensor, labels: Tensor | None = None, train_mask: Tensor | None = None,
    virtual_node: bool = False,
) -> Context:
    """With ``virtual_node``, hops are those of the graph without its virtual nodes (through one, every
    pair of nodes is 2 hops apart), and no virtual node is a query."""
    labels = None if labels is None else labels.cpu()
    base = None
    if labels is not None and split_nodes.numel():
        # Chance that a uniformly drawn node of the graph shares a split query's label.
        share = torch.bincount(labels).double() / labels.numel()
        base = float(share[labels[split_nodes]].mean())
    train = None if train_mask is None else train_mask.cpu().double()
    owner, ptr = graph.get("batch"), graph.get("ptr")  # a PyG Batch carries both
    if owner is None:
        owner, ptr = torch.zeros(graph.num_nodes, dtype=torch.long), torch.tensor([0, graph.num_nodes])
    owner, ptr, edge_index = owner.cpu(), ptr.cpu(), graph.edge_index.cpu()
    virtual = None
    if virtual_node:
        virtual = virtual_node_mask(graph).cpu()
        if int(virtual.sum()) != ptr.numel() - 1 or not bool(virtual[ptr[1:] - 1].all()):
            raise ValueError("data.virtual_node: expected one virtual node per graph, its last node")
        edge_index = edge_index[:, ~(virtual[edge_index[0]] | virtual[edge_index[1]])]
        split_nodes = split_nodes[~virtual[split_nodes]]
    adjacency = undirected_adjacency(edge_index, graph.num_nodes)
    return Context(adjacency, split_nodes, labels, train, base, owner, ptr, virtual)


def key_hops(context: Context, sources: Tensor, index: Tensor) -> Tensor:
    """``[C, H, k]`` hops from each source to its keys (``-1`` beyond the cap or padding)."""
    hops = hop_distances(context.adjacency, sources.numpy(), index.reshape(index.shape[0], -1).numpy())
    return torch.from_numpy(hops).view(index.shape)


def chunks(nodes: Tensor, size: int | None = None) -> list[Tensor]:
    """``nodes`` in runs of ``size`` (default :data:`CHUNK`, read at the call)."""
    size = CHUNK if size is None else size
    return list(nodes.split(size)) if nodes.numel() else []


def add_mpnn_reference(accumulator: Accumulator, context: Context) -> None:
    """Fold in the 1-hop neighbourhood of each split query, with uniform weights (the graph's virtual node,
    if any, is one more neighbour: the message passing reads it too)."""
    adjacency = context.adjacency
    degree = torch.from_numpy(np.diff(adjacency.indptr))
    width = max(1, int(degree.max()))
    indptr = torch.from_numpy(adjacency.indptr)
    # A trailing -1 that every slot past a node's degree points at: those slots become padding.
    indices = torch.cat([torch.from_numpy(adjacency.indices), torch.tensor([-1])])
    accumulator.start_graph(adjacency.shape[0])
    for sources in chunks(context.split_nodes, max(1, CHUNK * 16 // width)):
        slots = torch.arange(width)
        valid = slots < degree[sources, None]
        index = indices[torch.where(valid, indptr[sources, None] + slots, indices.numel() - 1)]
        count = degree[sources, None]
        if context.virtual is not None:
            hub = context.ptr[context.owner[sources] + 1] - 1  # each graph's last node
            index, valid = torch.cat([index, hub[:, None]], 1), F.pad(valid, (0, 1), value=True)
            count = count + 1
        index = index[:, None, :]
        weight = (valid / count.clamp(min=1))[:, None, :]
        selection = AttentionSelection(index, weight, weight)
        accumulator.add(sources, selection, key_hops(context, sources, index), context)


def add_uniform_reference(
    accumulator: Accumulator, context: Context, k: int, generator: torch.Generator
) -> None:
    """Fold in k keys per split query drawn uniformly, with replacement, from the query's own graph
    (itself included; its virtual node not), with weights 1/k: where attention would look if its choice
    were blind."""
    accumulator.start_graph(context.adjacency.shape[0])
    for sources in chunks(context.split_nodes):
        graph = context.owner[sources]
        start, size = context.ptr[graph], context.ptr[graph + 1] - context.ptr[graph]
        if context.virtual is not None:
            size = size - 1  # the virtual node is the graph's last
        start, size = start[:, None, None], size[:, None, None]
        draw = torch.rand(sources.numel(), 1, k, generator=generator, dtype=torch.float64)
        index = start + (draw * size).long().clamp(max=size - 1)
        weight = torch.full(index.shape, 1.0 / k, dtype=torch.float64)
        selection = AttentionSelection(index, weight, weight)
        accumulator.add(sources, selection, key_hops(context, sources, index), context)


def query_rows(
    context: Context, queries: Tensor, selection: AttentionSelection, hops: Tensor, head: int
) -> list[dict[str, Any]]:
    """JSON rows of the chosen queries for one head: each query's keys, best first."""
    rows = []
    for q, node in enumerate(queries.tolist()):
        label = None if context.labels is None else int(context.labels[node])
        keys = []
        for slot, key in enumerate(selection.index[q, head].tolist()):
            if key < 0:
                continue
            hop = int(hops[q, head, slot])
            keys.append(
                {
                    "node": key,
                    "score": float(selection.score[q, head, slot]),
                    "weight": float(selection.weight[q, head, slot]),
                    "hops": hop if hop >= 0 else None,
                    "train": None if context.train is None else bool(context.train[key]),
                    "same_label": None if label is None else int(context.labels[key]) == label,
                }
            )
        row: dict[str, Any] = {"node": node, "label": label, "keys": keys}
        if selection.mass is not None:
            row["mass"] = float(selection.mass[q, head])
        rows.append(row)
    return rows


def share_beyond(histogram: dict[str, float], hops: int) -> float:
    """Share of a ``hops_histogram``'s weight farther than ``hops`` (the ``">64"`` bin included)."""
    return sum(share for label, share in histogram.items() if label == f">{HOP_CAP}" or int(label) > hops)


def summary_rows(explanation: dict[str, Any], reach: int) -> list[dict[str, Any]]:
    """Per explained layer (over its heads: mean, min, max) and per reference: mean hops, the share of
    weight beyond ``reach`` hops (what the message passing cannot see), the entropy, the distinct keys
    per graph (far below the queries per graph: many queries read the same few keys) and the weight on
    the virtual node (``None`` without one)."""
    graphs = explanation["num_graphs"]
    by_layer: dict[int, list[dict[str, Any]]] = {}
    for entry in explanation["layers"]:
        by_layer.setdefault(entry["layer"], []).append(entry["stats"])
    named = [(f"layer {layer}", stats) for layer, stats in sorted(by_layer.items())]
    named += [
        ("uniform keys", [explanation["uniform_reference"]]),
        ("MPNN 1-hop", [explanation["mpnn_reference"]]),
    ]
    rows = []
    for name, stats in named:
        figures = {
            "mean_hops": [s["mean_hops"] for s in stats if s["mean_hops"] is not None],
            "beyond": [share_beyond(s["hops_histogram"], reach) for s in stats],
            "entropy": [s["entropy"] for s in stats if s["entropy"] is not None],
            "distinct_per_graph": [s["distinct_keys"] / graphs for s in stats],
            "virtual": [v for s in stats if (v := s.get("weight_on_virtual_node")) is not None],
        }
        rows.append({"name": name, **{key: _spread(values) for key, values in figures.items()}})
    return rows


def _spread(values: list[float]) -> tuple[float, float, float] | None:
    return (float(np.mean(values)), min(values), max(values)) if values else None
