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
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from tqdm import tqdm

from kmipgt.analysis.explain_stats import (
    Accumulator,
    Context,
    add_mpnn_reference,
    add_uniform_reference,
    chunks,
    graph_context,
    key_hops,
    query_rows,
)
from kmipgt.analysis.hops import HOP_CAP
from kmipgt.logs import quiet
from kmipgt.nn import GraphTransformer, ProjectedAttention
from kmipgt.nn.attention_kinds import ATTENTION_KINDS
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
]

def explainable_kinds() -> tuple[str, ...]:
    """The registered attention kinds whose attended keys can be explained (``explain`` flag set)."""
    return tuple(name for name, kind in ATTENTION_KINDS.items() if kind.explain is not None)


def attention_modules(model: GraphTransformer) -> dict[int, ProjectedAttention]:
    """The global attention module of each layer that has one, by layer number (the attention's
    ``layers`` may leave layers without); ValueError unless each has explicit weights and at least one
    layer has one."""
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
        attention's ``layers`` say otherwise; :func:`attention_modules` names them), on the CPU:
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

    Per explained layer an :class:`Accumulator` over its heads; one each for the MPNN's 1-hop reference
    and the uniform reference (``k`` random keys of the query's own graph, drawn with ``seed``).
    """

    def __init__(
        self, model: GraphTransformer, k: int, layers: list[int], bar: tqdm | None, seed: int
    ) -> None:
        self.model, self.modules, self.layers, self.bar = model, attention_modules(model), layers, bar
        self.requested_k = self.k = k
        self.accumulators: dict[int, Accumulator] = {}
        self.mpnn, self.uniform = Accumulator(1), Accumulator(1)
        self.generator = torch.Generator().manual_seed(seed)
        self.num_queries = self.num_graphs = 0

    def observe(
        self,
        graph: Data,
        context: Context,
        chosen: Callable[[int, AttentionSelection], None] | None = None,
    ) -> None:
        """One forward over ``graph``: fold in each split query; each layer's selection goes to ``chosen``."""
        query_chunks = chunks(context.split_nodes)

        def consume(number: int, selection: AttentionSelection) -> None:
            if number not in self.layers:
                return
            self.k = selection.index.shape[-1]
            accumulator = self.accumulators.setdefault(number, Accumulator(selection.index.shape[1]))
            accumulator.start_graph(graph.num_nodes)
            for sources in query_chunks:
                part = _rows(selection, sources)
                accumulator.add(sources, part, key_hops(context, sources, part.index), context)
                if self.bar is not None:
                    self.bar.update()
            if chosen is not None:
                chosen(number, selection)

        with _streaming(self.modules, self.requested_k, consume):
            run_forward(self.model, graph)
        add_mpnn_reference(self.mpnn, context)
        add_uniform_reference(self.uniform, context, self.k, self.generator)
        self.num_queries += context.split_nodes.numel()
        self.num_graphs += context.ptr.numel() - 1

    def result(
        self, context: Context, num_nodes: int, heads: list[int], queries: dict[tuple[int, int], list]
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
    context = graph_context(graph, split_nodes, labels, train_mask, virtual_node)
    if context.virtual is not None and bool(context.virtual[queries].any()):
        hub = int(queries[context.virtual[queries]][0])
        raise ValueError(f"node {hub} is the virtual node: it is no query")
    rows: dict[tuple[int, int], list] = {}

    def listed(number: int, selection: AttentionSelection) -> None:
        chosen = _rows(selection, queries)
        hops = key_hops(context, queries, chosen.index)
        for h in heads:
            rows[number, h] = query_rows(context, queries, chosen, hops, h)

    with _bar(progress, len(layers) * len(chunks(split_nodes))) as bar:
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
            context = graph_context(graph, torch.arange(graph.num_nodes), virtual_node=virtual_node)
            explainer.observe(graph, context)
            bar.update()
    if context is None:
        raise ValueError("the split has no graph to explain")
    # Every node is a query here, so the nodes of the split are its queries.
    return explainer.result(context, explainer.num_queries, heads, {})
