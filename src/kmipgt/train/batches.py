"""A graph or mini-batch on its way into a model: the keyword inputs it carries, its copy to the device and
the forward call, the same at every task level and wherever a model runs (training, predictions, export)."""

from __future__ import annotations

import torch
from torch_geometric.data import Data

from kmipgt.nn.model import check_node_pairs
from kmipgt.ops.ragged import graph_ptr
from kmipgt.train.padding import EDGE_MASK, NODE_MASK
from kmipgt.train.resident import HOST_PTR

__all__ = ["batch_to_device", "forward", "model_inputs"]


def model_inputs(batch: Data) -> dict[str, torch.Tensor | None]:
    """The keyword inputs of a model's forward that a graph, mini-batch or link split carries.

    The mini-batch vector and its graph offsets (graph level; the host copy of :func:`batch_to_device`
    where there is one) and the scored pairs (edge level) are read where present, so one call serves every
    level and the saved-token dump alike.
    """
    graphs = getattr(batch, "batch", None)
    # A batch packed to a fixed size (data.pad_to) marks its real rows; other batches pass no masks, so
    # models without them (the baselines' forward) are called as before.
    masks = {key: batch[key] for key in (NODE_MASK, EDGE_MASK) if getattr(batch, key, None) is not None}
    return {
        "x": batch.x,
        "edge_index": batch.edge_index,
        "batch": graphs,
        "edge_attr": batch.edge_attr,
        "lappe": getattr(batch, "lappe", None),
        "rwse": getattr(batch, "rwse", None),
        "edge_label_index": getattr(batch, "edge_label_index", None),
        "ptr": None if graphs is None else getattr(batch, HOST_PTR, getattr(batch, "ptr", None)),
        **masks,
    }


def forward(model: torch.nn.Module, batch: Data) -> torch.Tensor:
    """``model``'s output on a graph, mini-batch or link split, passing the inputs it carries
    (:func:`model_inputs`)."""
    return model(**model_inputs(batch))


def batch_to_device(batch: Data, device: torch.device) -> Data:
    """``batch`` on ``device``, its edges checked on the host first (the model only asserts their range on
    the device). A mini-batch of graphs keeps the loader's CPU ``ptr``, validated and pinned, as
    ``host_ptr``: :func:`forward` passes it to the model, so that no layer reads the graph offsets back
    from the device."""
    ptr = getattr(batch, "ptr", None)
    if ptr is not None:
        ptr = graph_ptr(batch.num_nodes, ptr=ptr)
        ptr = ptr.pin_memory() if torch.device(device).type == "cuda" else ptr
    edge_index = getattr(batch, "edge_index", None)
    if isinstance(edge_index, torch.Tensor) and edge_index.device.type == "cpu":
        check_node_pairs("edge_index", edge_index, batch.num_nodes)
    moved = batch.to(device, non_blocking=True)
    if ptr is not None:
        setattr(moved, HOST_PTR, ptr)
    return moved
