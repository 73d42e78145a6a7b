"""Which keys a trained model's global attention attends to, and statistics of them over a split.

The keys and weights are the ones the forward pass itself used: every attention module of a kind with explicit
weights (``explain`` in its :class:`~kmipgt.nn.AttentionKind`: k-MIP's own selection, full attention's largest
weights) keeps its last selection while ``keep_attention`` is set, and a forward hook hands it on as soon as
the layer has run. Only the chosen queries' rows are kept (``O(Q·k·layers·heads)``); statistics over every
query of a split are accumulated chunk by chunk from one layer's selection before the next layer runs, and
over a split of many graphs batch by batch (:func:`explain_graphs`).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sized
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data
from tqdm import tqdm

from kmipgt.analysis.hops import HOP_CAP, hop_distances, undirected_adjacency
from kmipgt.data import virtual_node_mask
from kmipgt.logs import quiet
from kmipgt.nn import GraphTransformer, ProjectedAttention
from kmipgt.nn.attention_kinds import registered_attention
from kmipgt.ops import AttentionSelection

__all__ = [
    "HOP_CAP",
    "attended_keys",
    "attention_modules",
    "check_queries",
    "explain",
    "explain_graphs",
    "explainable_kinds",
    "run_forward",
    "sample_queries",
    "select_layers_heads",
    "share_beyond",
    "summary_rows",
]

# Queries per statistics chunk: bounds the [chunk, H, k] gathers and the hop search's working set.
_CHUNK = 4096
HOP_LABELS = [*(str(h) for h in range(HOP_CAP + 1)), f">{HOP_CAP}"]


def explainable_kinds() -> tuple[str, ...]:
    """The registered attention kinds whose attended keys can be explained (``explain`` flag set)."""
    return tuple(name for name, kind in registered_attention().items() if kind.explain is not None)


def attention_modules(model: GraphTransformer) -> dict[int, ProjectedAttention]:
    """The global attention module of each layer that has one, by layer number (``attention_layers`` may
    leave layers without); ValueError unless each has explicit weights and at least one layer has one."""
    supported = " and ".join(map(repr, explainable_kinds()))
    if len(model.layers) == 0:
        raise ValueError("the model has no layers, so no attention to explain")
    modules = {}
    for number, layer in enumerate(model.layers):
        if layer.attention is None:
            continue
        if layer.attention.kind.explain is None:
            raise ValueError(f"attention kind {layer.attention_kind!r} (layer {number}) has no explicit "
                             f"attention weights; explain supports {supported}")
        modules[number] = layer.attention
    if not modules:
        raise ValueError(f"attention kind 'none' in every layer, so no attention weights; explain supports "
                         f"{supported}")
    return modules


@contextlib.contextmanager
def _streaming(
    modules: dict[int, ProjectedAttention], k: int,
    consume: Callable[[int, AttentionSelection], None],
) -> Iterator[None]:
    """While active, each module's forward hands ``(layer, selection)`` to ``consume`` and keeps nothing."""
    saved = [(module.keep_attention, getattr(module, "kept_keys", None)) for module in modules.values()]
    handles = []
    for layer, module in modules.items():
        module.keep_attention = True
        if _top_weights(module):
            module.kept_keys = k

        def hook(module, args, output, layer=layer):
            selection, module.last_attention = module.last_attention, None
            consume(layer, selection)

        handles.append(module.register_forward_hook(hook))
    try:
        yield
    finally:
        for module, handle, (keep, kept) in zip(modules.values(), handles, saved):
            handle.remove()
            module.keep_attention = keep
            if kept is not None:
                module.kept_keys = kept


@torch.no_grad()
def run_forward(model: GraphTransformer, graph: Data) -> None:
    """One forward of ``model`` over ``graph`` (eval mode, on the model's device)."""
    was_training = model.training
    model.eval()
    graph = graph.to(next(model.parameters()).device)
    try:
        model.embed(
            graph.x,
            graph.edge_index,
            batch=graph.get("batch"),
            edge_attr=graph.get("edge_attr"),
            lappe=graph.get("lappe"),
            rwse=graph.get("rwse"),
        )
    finally:
        model.train(was_training)


def check_queries(queries: Tensor | list[int] | None, num_nodes: int) -> Tensor:
    """``[Q]`` int64 node ids (all ``num_nodes`` when None); ValueError naming an id out of range."""
    if queries is None:
        return torch.arange(num_nodes)
    queries = torch.as_tensor(queries, dtype=torch.long).flatten()
    bad = queries[(queries < 0) | (queries >= num_nodes)]
    if bad.numel():
        raise ValueError(f"node {int(bad[0])} is out of range for a graph of {num_nodes} nodes")
    return queries


def sample_queries(split_nodes: Tensor, count: int, seed: int = 0) -> Tensor:
    """``[min(count, S)]`` distinct nodes drawn from ``split_nodes`` with ``seed``, in increasing order."""
    if count < 1:
        raise ValueError(f"the number of sampled queries must be >= 1, got {count}")
    rng = np.random.default_rng(seed)
    picked = rng.choice(split_nodes.numel(), size=min(count, split_nodes.numel()), replace=False)
    return split_nodes[torch.from_numpy(picked)].sort().values


def _rows(selection: AttentionSelection, rows: Tensor) -> AttentionSelection:
    return AttentionSelection(*(None if t is None else t[rows.to(t.device)].cpu() for t in selection))


def attended_keys(
    model: GraphTransformer, graph: Data, queries: Tensor | list[int] | None = None, *, k: int = 16
) -> list[AttentionSelection]:
    """For each layer with attention, the keys each chosen query attends to, with scores and softmax weights.

    Args:
        model: a :class:`~kmipgt.nn.GraphTransformer` whose attention kind is ``kmip`` or ``full``.
        graph: the input graph (``x``, ``edge_index``, ``edge_attr``, encodings as the model was trained).
        queries: ``[Q]`` node ids (default: every node).
        k: for full attention, how many of the largest weights to keep (k-MIP keeps its own k).

    Returns:
        One :class:`~kmipgt.ops.AttentionSelection` per layer with attention (every layer unless the
        model's ``attention_layers`` says otherwise; :func:`attention_modules` names them), on the CPU:
        ``index``, ``score`` (``q·k``, unscaled) and ``weight`` ``[Q, H, k]``, keys by decreasing score;
        full attention adds ``mass`` ``[Q, H]`` (its weights are renormalised over the k). Memory
        ``O(Q·k·layers·heads)``.
    """
    queries = check_queries(queries, graph.num_nodes)
    kept: list[AttentionSelection] = []
    with _streaming(
        attention_modules(model), k, lambda layer, selection: kept.append(_rows(selection, queries))
    ):
        run_forward(model, graph)
    return kept


@dataclass
class _Accumulator:
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

    def add(self, sources: Tensor, selection: AttentionSelection, hops: Tensor, context: _Context) -> None:
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

    def stats(self, head: int, context: _Context, mass: bool = False) -> dict[str, Any]:
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
class _Context:
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


def _context(
    graph: Data, split_nodes: Tensor, labels: Tensor | None = None, train_mask: Tensor | None = None,
    virtual_node: bool = False,
) -> _Context:
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
    return _Context(adjacency, split_nodes, labels, train, base, owner, ptr, virtual)


def _key_hops(context: _Context, sources: Tensor, index: Tensor) -> Tensor:
    """``[C, H, k]`` hops from each source to its keys (``-1`` beyond the cap or padding)."""
    hops = hop_distances(context.adjacency, sources.numpy(), index.reshape(index.shape[0], -1).numpy())
    return torch.from_numpy(hops).view(index.shape)


def _chunks(nodes: Tensor, size: int = _CHUNK) -> list[Tensor]:
    return list(nodes.split(size)) if nodes.numel() else []


def _add_mpnn_reference(accumulator: _Accumulator, context: _Context) -> None:
    """Fold in the 1-hop neighbourhood of each split query, with uniform weights (the graph's virtual node,
    if any, is one more neighbour: the message passing reads it too)."""
    adjacency = context.adjacency
    degree = torch.from_numpy(np.diff(adjacency.indptr))
    width = max(1, int(degree.max()))
    indptr = torch.from_numpy(adjacency.indptr)
    # A trailing -1 that every slot past a node's degree points at: those slots become padding.
    indices = torch.cat([torch.from_numpy(adjacency.indices), torch.tensor([-1])])
    accumulator.start_graph(adjacency.shape[0])
    for sources in _chunks(context.split_nodes, max(1, _CHUNK * 16 // width)):
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
        accumulator.add(sources, selection, _key_hops(context, sources, index), context)


def _add_uniform_reference(
    accumulator: _Accumulator, context: _Context, k: int, generator: torch.Generator
) -> None:
    """Fold in k keys per split query drawn uniformly, with replacement, from the query's own graph
    (itself included; its virtual node not), with weights 1/k: where attention would look if its choice
    were blind."""
    accumulator.start_graph(context.adjacency.shape[0])
    for sources in _chunks(context.split_nodes):
        graph = context.owner[sources]
        start, size = context.ptr[graph], context.ptr[graph + 1] - context.ptr[graph]
        if context.virtual is not None:
            size = size - 1  # the virtual node is the graph's last
        start, size = start[:, None, None], size[:, None, None]
        draw = torch.rand(sources.numel(), 1, k, generator=generator, dtype=torch.float64)
        index = start + (draw * size).long().clamp(max=size - 1)
        weight = torch.full(index.shape, 1.0 / k, dtype=torch.float64)
        selection = AttentionSelection(index, weight, weight)
        accumulator.add(sources, selection, _key_hops(context, sources, index), context)


def _query_rows(
    context: _Context, queries: Tensor, selection: AttentionSelection, hops: Tensor, head: int
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


def select_layers_heads(
    model: GraphTransformer, layer: int | None = None, head: int | None = None
) -> tuple[list[int], list[int]]:
    """The layers (those with attention) and heads to explain (``None``: all); ValueError naming one that
    does not exist or has no attention."""
    modules = attention_modules(model)
    for name, value, count in (("layer", layer, len(model.layers)), ("head", head, _first(modules).heads)):
        if value is not None and not 0 <= value < count:
            raise ValueError(f"{name} {value} does not exist: the model has {count} {name}s (0-{count - 1})")
    if layer is not None and layer not in modules:
        raise ValueError(f"layer {layer} has no global attention; the layers with attention are "
                         f"{', '.join(map(str, modules))}")
    layers = list(modules) if layer is None else [layer]
    return layers, list(range(_first(modules).heads)) if head is None else [head]


def _first(modules: dict[int, ProjectedAttention]) -> ProjectedAttention:
    """The first layer's attention: every layer with attention has the same kind and heads."""
    return next(iter(modules.values()))


def _top_weights(module: ProjectedAttention) -> bool:
    """Whether ``module`` keeps the largest weights of a softmax over every key (``kept_keys`` of them,
    renormalised, with their ``mass``), not the selection its forward used."""
    return module.kind.explain == "top_weights"


class _Explainer:
    """Statistics of a model's attention over split queries, folded in one graph (or batch) at a time.

    Per explained layer an :class:`_Accumulator` over its heads; one each for the MPNN's 1-hop reference
    and the uniform reference (``k`` random keys of the query's own graph, drawn with ``seed``).
    """

    def __init__(
        self, model: GraphTransformer, k: int, layers: list[int], bar: tqdm | None, seed: int
    ) -> None:
        self.model, self.modules, self.layers, self.bar = model, attention_modules(model), layers, bar
        self.requested_k = self.k = k
        self.accumulators: dict[int, _Accumulator] = {}
        self.mpnn, self.uniform = _Accumulator(1), _Accumulator(1)
        self.generator = torch.Generator().manual_seed(seed)
        self.num_queries = self.num_graphs = 0

    def observe(
        self,
        graph: Data,
        context: _Context,
        chosen: Callable[[int, AttentionSelection], None] | None = None,
    ) -> None:
        """One forward over ``graph``: fold in each split query; each layer's selection goes to ``chosen``."""
        chunks = _chunks(context.split_nodes)

        def consume(number: int, selection: AttentionSelection) -> None:
            if number not in self.layers:
                return
            self.k = selection.index.shape[-1]
            accumulator = self.accumulators.setdefault(number, _Accumulator(selection.index.shape[1]))
            accumulator.start_graph(graph.num_nodes)
            for sources in chunks:
                part = _rows(selection, sources)
                accumulator.add(sources, part, _key_hops(context, sources, part.index), context)
                if self.bar is not None:
                    self.bar.update()
            if chosen is not None:
                chosen(number, selection)

        with _streaming(self.modules, self.requested_k, consume):
            run_forward(self.model, graph)
        _add_mpnn_reference(self.mpnn, context)
        _add_uniform_reference(self.uniform, context, self.k, self.generator)
        self.num_queries += context.split_nodes.numel()
        self.num_graphs += context.ptr.numel() - 1

    def result(
        self, context: _Context, num_nodes: int, heads: list[int], queries: dict[tuple[int, int], list]
    ) -> dict[str, Any]:
        """The ``explain.json`` content; ``queries`` maps ``(layer, head)`` to its listed query rows."""
        full = _top_weights(_first(self.modules))
        layers = [
            {
                "layer": number,
                "head": h,
                "queries": queries.get((number, h), []),
                "stats": self.accumulators[number].stats(h, context, mass=full),
            }
            for number in sorted(self.accumulators)
            for h in heads
        ]
        return {
            "k": self.k,
            "attention": _first(self.modules).attn_type,
            "num_nodes": num_nodes,
            "num_queries": self.num_queries,
            "num_graphs": self.num_graphs,
            "hop_cap": HOP_CAP,
            "layers": layers,
            "mpnn_reference": self.mpnn.stats(0, context),
            "uniform_reference": self.uniform.stats(0, context),
        }


def _bar(progress: bool, total: int | None) -> tqdm:
    return tqdm(total=total, desc="explain", disable=not (progress and not quiet()), file=sys.stderr)


def explain(
    model: GraphTransformer,
    graph: Data,
    split_nodes: Tensor,
    queries: Tensor | list[int],
    *,
    k: int = 16,
    labels: Tensor | None = None,
    train_mask: Tensor | None = None,
    layer: int | None = None,
    head: int | None = None,
    progress: bool = False,
    seed: int = 0,
    virtual_node: bool = False,
) -> dict[str, Any]:
    """Attended keys of the chosen queries and attention statistics over every query of a split.

    Statistics per layer and head, over the split's queries (streamed in chunks of queries): the
    weight-weighted histogram of hop distances from query to key in the undirected graph (``">64"``:
    farther or unreachable), the weight-averaged hop distance over keys within the cap, the share of
    weight on training nodes, the weighted same-label rate next to the base rate (a random node of the
    graph sharing the query's label), the mean entropy of the weights (nats), and the number of distinct
    keys with positive weight. ``mpnn_reference`` gives the same figures for each query's 1-hop
    neighbours with uniform weights; ``uniform_reference`` for k keys drawn uniformly from the query's
    graph (with replacement, with ``seed``), the figures of attention that chooses blindly.

    On a graph with a virtual node (``virtual_node``, :func:`kmipgt.data.add_virtual_node`) hops are those
    of the graph without it, the virtual node is no query and no uniform key, and the weight on it is
    ``weight_on_virtual_node``, not a bin of the histogram (which then sums to 1 over the other keys).

    Args:
        model: a trained :class:`~kmipgt.nn.GraphTransformer` with ``kmip`` or ``full`` attention.
        graph: its input graph.
        split_nodes: ``[S]`` the queries the statistics run over.
        queries: ``[Q]`` the queries listed with their keys.
        k: kept weights per query for full attention (k-MIP uses its own).
        labels: ``[N]`` class per node, or None (no label figures).
        train_mask: ``[N]`` bool, training-labelled nodes, or None.
        layer, head: restrict the output to one layer / head (default: all).
        progress: show a progress bar while streaming the split's queries.
        seed: seed of the uniform reference's keys.
        virtual_node: the graph has a virtual node (:func:`kmipgt.data.add_virtual_node`), see above.

    Returns:
        ``{"k", "attention", "num_nodes", "num_queries", "num_graphs", "hop_cap", "layers": [{"layer", "head",
        "queries": [...], "stats": {...}}, ...], "mpnn_reference": {...}, "uniform_reference": {...}}``
        (the ``explain.json`` shape).
    """
    layers, heads = select_layers_heads(model, layer, head)
    queries = check_queries(queries, graph.num_nodes)
    split_nodes = check_queries(split_nodes, graph.num_nodes)
    context = _context(graph, split_nodes, labels, train_mask, virtual_node)
    if context.virtual is not None and bool(context.virtual[queries].any()):
        hub = int(queries[context.virtual[queries]][0])
        raise ValueError(f"node {hub} is the virtual node: it is no query")
    rows: dict[tuple[int, int], list] = {}

    def listed(number: int, selection: AttentionSelection) -> None:
        chosen = _rows(selection, queries)
        hops = _key_hops(context, queries, chosen.index)
        for h in heads:
            rows[number, h] = _query_rows(context, queries, chosen, hops, h)

    with _bar(progress, len(layers) * len(_chunks(split_nodes))) as bar:
        explainer = _Explainer(model, k, layers, bar, seed)
        explainer.observe(graph, context, listed)
    virtual = 0 if context.virtual is None else int(context.virtual.sum())
    return explainer.result(context, graph.num_nodes - virtual, heads, rows)


def explain_graphs(
    model: GraphTransformer,
    batches: Iterable[Data],
    *,
    k: int = 16,
    layer: int | None = None,
    head: int | None = None,
    progress: bool = False,
    seed: int = 0,
    virtual_node: bool = False,
) -> dict[str, Any]:
    """:func:`explain`'s statistics over every node of every graph of a graph-level split.

    Each batch (a PyG ``Batch`` of disjoint graphs, as the run's evaluation loader yields them) runs one
    forward; all its nodes are queries, attention stays within each graph, and the uniform reference draws
    from the query's own graph. No query is listed, and there are no label figures (graph-level tasks have
    no node labels). ``num_nodes`` and ``num_graphs`` in the result are totals over the split (of the
    graphs' own nodes, without virtual nodes: ``virtual_node`` as in :func:`explain`).
    """
    layers, heads = select_layers_heads(model, layer, head)
    context = None
    explainer = _Explainer(model, k, layers, None, seed)
    total = len(batches) if isinstance(batches, Sized) else None
    with _bar(progress, total) as bar:
        for graph in batches:
            context = _context(graph, torch.arange(graph.num_nodes), virtual_node=virtual_node)
            explainer.observe(graph, context)
            bar.update()
    if context is None:
        raise ValueError("the split has no graph to explain")
    # Every node is a query here, so the nodes of the split are its queries.
    return explainer.result(context, explainer.num_queries, heads, {})


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
