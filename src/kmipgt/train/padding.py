"""``data.pad_to``: mini-batches of small graphs packed to one fixed size, padding that changes no result.

A batch of ``G`` graphs, ``N`` nodes and ``E`` edges becomes one of exactly ``graphs`` graphs, ``nodes`` nodes
and ``edges`` edges, so that a compiled model sees one shape for every batch. The padding is laid out so that
it cannot reach the real graphs:

- the padding nodes come after the real ones, in padding graphs of their own after the real graphs (spread
  evenly over them: a padding graph stays small, and so does its attention), with zero features and
  encodings; attention, per-graph norms and pooling never mix graphs, so no real node attends to, or is
  pooled or normalised with, a padding node;
- the padding edges come after the real ones, each a self-loop of a padding node, with zero features;
- ``node_mask`` / ``edge_mask`` mark the real rows, and the model's BatchNorms take their statistics (and
  update their running statistics) over those rows alone (:func:`kmipgt.nn.padding.masked_batch_norm`);
- the model's output has a row per graph of the budget; the first ``real_graphs`` rows are the real graphs'
  (:data:`REAL_GRAPHS`), and the loss and metrics read those only.

Loss, gradients, metrics and BatchNorm running statistics then equal those of the unpadded batch, to float
rounding. Random draws over rows (dropout) are drawn over the padded rows, so with dropout a padded run
draws other masks than an unpadded one.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence

import torch
from torch_geometric.data import Batch, Data

from kmipgt.ops.ragged import host_to_device
from kmipgt.train.pad_budget import PadBudget
from kmipgt.train.resident import HOST_PTR

__all__ = [
    "EDGE_MASK", "NODE_MASK", "REAL_GRAPHS", "TYPICAL_SPREAD", "PadBudget", "fitted_budgets", "pad_batch",
    "pad_to_fit", "required_budget",
]

NODE_MASK, EDGE_MASK = "node_mask", "edge_mask"
# The attribute under which a padded batch keeps its number of real graphs (a host int): the first rows of
# the model's graph-level output.
REAL_GRAPHS = "real_graphs"


def required_budget(graphs: Sequence[Data], batch_size: int) -> PadBudget:
    """The smallest budget that holds every batch of ``batch_size`` of ``graphs`` (in any order) with room for
    at least one padding node and one padding graph: the ``batch_size`` largest graphs' nodes plus one, their
    edges, ``batch_size`` graphs plus one."""
    size = min(batch_size, len(graphs))
    nodes = torch.tensor([graph.num_nodes for graph in graphs])
    edges = torch.tensor([graph.num_edges for graph in graphs])
    largest_nodes = int(nodes.topk(size).values.sum()) if size else 0
    largest_edges = int(edges.topk(size).values.sum()) if size else 0
    return PadBudget(largest_nodes + 1, largest_edges, size + 1)


# ``auto``'s smaller budget holds a batch up to this many standard deviations above a random batch's mean
# size: beyond it (about one batch in 10^9, were the sums normal) a batch takes the larger budget, one
# more compiled shape, never a result changed.
TYPICAL_SPREAD = 6.0


def _padding_graphs(nodes: int, largest_graph: int) -> int:
    """Padding graphs enough that ``nodes`` padding nodes spread over them make none larger than
    ``largest_graph``."""
    return -(-nodes // max(largest_graph, 1))


def _typical_sizes(graphs: Sequence[Data], batch_size: int) -> tuple[float, float]:
    """Nodes and edges of a random batch of ``batch_size`` of ``graphs``, its mean plus
    :data:`TYPICAL_SPREAD` standard deviations (the sizes' sum drawn without replacement)."""
    size = min(batch_size, len(graphs))
    bounds = []
    for sizes in ([g.num_nodes for g in graphs], [g.num_edges for g in graphs]):
        counts = torch.tensor(sizes, dtype=torch.float64)
        shrink = (len(graphs) - size) / max(len(graphs) - 1, 1)
        spread = (size * counts.var(correction=0) * shrink).sqrt()
        bounds.append(float(size * counts.mean() + TYPICAL_SPREAD * spread))
    return bounds[0], bounds[1]


def fitted_budgets(splits: Iterable[Sequence[Data]], batch_size: int) -> tuple[PadBudget, ...]:
    """``data.pad_to: auto``, smallest first: a budget for nearly every batch (nodes and edges a random
    batch of any split reaches at most :data:`TYPICAL_SPREAD` standard deviations above its mean) and,
    where that is smaller, one for every possible batch (:func:`required_budget` of each split). Each
    has graphs enough that the padding nodes, spread over the padding graphs, make none larger than the
    largest real graph, however few graphs a batch holds (the last of an epoch, say): a padding graph
    falls in the attention's size buckets as the real ones do.
    """
    splits = [graphs for graphs in splits if len(graphs)]
    if not splits:
        raise ValueError("data.pad_to: auto needs graphs to size the budget from; every split is empty")
    needed = [required_budget(graphs, batch_size) for graphs in splits]
    nodes, edges = max(b.nodes for b in needed), max(b.edges for b in needed)
    most_graphs = max(b.graphs for b in needed) - 1
    largest_graph = max(max(graph.num_nodes for graph in graphs) for graphs in splits)
    typical = [_typical_sizes(graphs, batch_size) for graphs in splits]
    typical_nodes = min(nodes, math.ceil(max(t[0] for t in typical)) + 1)
    typical_edges = min(edges, math.ceil(max(t[1] for t in typical)))
    budgets = {PadBudget(n, e, most_graphs + _padding_graphs(n, largest_graph))
               for n, e in ((typical_nodes, typical_edges), (nodes, edges))}
    return tuple(sorted(budgets, key=lambda budget: budget.nodes))


def pad_to_fit(batch: Batch, budgets: Sequence[PadBudget]) -> Batch:
    """``batch`` packed to the first of ``budgets`` that holds it (:func:`pad_batch`; its error where none
    does)."""
    sizes = _host_sizes(batch)[1:]
    return pad_batch(batch, next((b for b in budgets if b.holds(*sizes)), budgets[-1]))


def _host_sizes(batch: Batch) -> tuple[torch.Tensor, int, int, int]:
    """The CPU graph offsets of ``batch`` and its nodes, edges and graphs, read without the device."""
    host_ptr = getattr(batch, HOST_PTR, None)
    host_ptr = (batch.ptr if host_ptr is None else host_ptr).cpu()
    return host_ptr, int(host_ptr[-1]), batch.edge_index.shape[1], host_ptr.numel() - 1


def _padded(value: torch.Tensor, rows: int) -> torch.Tensor:
    """``value`` with ``rows`` rows of zeros appended along dimension 0."""
    return torch.cat([value, value.new_zeros((rows, *value.shape[1:]))])


def pad_batch(batch: Batch, budget: PadBudget) -> Batch:
    """``batch`` (a PyG mini-batch on any device; on a device with its CPU offsets as ``host_ptr``) packed to
    ``budget``: its node and edge attributes padded (module docstring), ``batch``, ``ptr`` (and
    ``host_ptr``) over the padding graphs, ``node_mask`` / ``edge_mask`` and ``real_graphs`` added.

    Every size comes from the host, so nothing waits for the device. ValueError where the batch does not
    fit: more nodes, edges or graphs than the budget, padding edges without a padding node to hold them, or
    padding nodes without a padding graph.
    """
    host_ptr, num_nodes, num_edges, num_graphs = _host_sizes(batch)
    edge_slices = batch._slice_dict.get("edge_index")
    pad_nodes, pad_edges = budget.nodes - num_nodes, budget.edges - num_edges
    pad_graphs = budget.graphs - num_graphs
    if not budget.holds(num_nodes, num_edges, num_graphs):
        raise ValueError(
            f"a batch of {num_graphs} graphs, {num_nodes} nodes and {num_edges} edges does not fit "
            f"data.pad_to {{nodes: {budget.nodes}, edges: {budget.edges}, graphs: {budget.graphs}}} with "
            "room for a padding node and a padding graph: raise the budget"
        )
    device = batch.edge_index.device
    node_keys, edge_keys = [], []
    for key, value in batch:
        if key in ("batch", "ptr", "edge_index", HOST_PTR) or not isinstance(value, torch.Tensor):
            continue
        slices = batch._slice_dict.get(key)
        if slices is None or batch.__cat_dim__(key, value) != 0:
            continue
        if torch.equal(slices, host_ptr):
            node_keys.append(key)
        elif edge_slices is not None and torch.equal(slices, edge_slices):
            edge_keys.append(key)
    out = copy.copy(batch)
    for key in node_keys:
        out[key] = _padded(batch[key], pad_nodes)
    for key in edge_keys:
        out[key] = _padded(batch[key], pad_edges)
    # Padding graph sizes: pad_nodes spread evenly over the padding graphs.
    sizes = torch.full((pad_graphs,), pad_nodes // max(pad_graphs, 1), dtype=torch.long)
    sizes[: pad_nodes % max(pad_graphs, 1)] += 1
    new_ptr = torch.cat([host_ptr, num_nodes + sizes.cumsum(0)])
    loops = num_nodes + torch.arange(pad_edges, device=device) % max(pad_nodes, 1)
    out.edge_index = torch.cat([batch.edge_index, loops.expand(2, -1)], 1)
    padding_graphs = torch.repeat_interleave(
        torch.arange(num_graphs, budget.graphs), sizes, output_size=pad_nodes
    )
    out.batch = torch.cat([batch.batch, host_to_device(padding_graphs, device)])
    if getattr(batch, HOST_PTR, None) is not None:
        setattr(out, HOST_PTR, new_ptr)
        out.ptr = host_to_device(new_ptr, device)
    else:
        out.ptr = host_to_device(new_ptr, batch.ptr.device)
    out[NODE_MASK] = torch.arange(budget.nodes, device=device) < num_nodes
    out[EDGE_MASK] = torch.arange(budget.edges, device=device) < num_edges
    setattr(out, REAL_GRAPHS, num_graphs)
    return out
