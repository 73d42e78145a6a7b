"""A random graph, a two-layer PyG model and the rank function of the halo-exchange test (spawned ranks
import this module). Every process builds the same graph and weights from fixed seeds."""

from __future__ import annotations

from pathlib import Path

import torch
from torch_geometric.nn import SAGEConv
from torch_geometric.utils import to_undirected

from kmipgt.distributed import count_communication
from kmipgt.distributed.halo import halo_exchange, halo_plan

NUM_NODES = 300
OFFSETS = [0, 140, 300]  # unequal shares on 2 ranks


def graph_and_model() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.nn.ModuleList]:
    """``x`` ``[N, 8]``, undirected ``edge_index``, upstream gradient ``[N, 8]`` and two SAGEConv layers."""
    gen = torch.Generator().manual_seed(0)
    edge_index = to_undirected(torch.randint(0, NUM_NODES, (2, 4 * NUM_NODES), generator=gen))
    x, grad_out = torch.randn(NUM_NODES, 8, generator=gen), torch.randn(NUM_NODES, 8, generator=gen)
    torch.manual_seed(0)
    return x, edge_index, grad_out, torch.nn.ModuleList([SAGEConv(8, 8), SAGEConv(8, 8)])


def two_layers(
    model: torch.nn.ModuleList, x: torch.Tensor, edge_index: torch.Tensor, exchange
) -> torch.Tensor:
    """``relu(conv1)``, then ``conv2``; ``exchange`` appends the halo to the rank's rows (or nothing)."""
    rows = x.shape[0]
    h = model[0](exchange(x), edge_index)[:rows].relu()
    return model[1](exchange(h), edge_index)[:rows]


def halo_ranks(rank: int, world: int, out_dir: str) -> None:
    """Forward and backward on this rank's nodes with halo exchange; saves rows, gradients and bytes."""
    x, edge_index, grad_out, model = graph_and_model()
    plan = halo_plan(edge_index, OFFSETS, rank)
    rows = slice(OFFSETS[rank], OFFSETS[rank + 1])
    local = x[rows].clone().requires_grad_()
    with count_communication() as counter:
        out = two_layers(model, local, plan.edge_index, lambda t: halo_exchange(t, plan))
        out.backward(grad_out[rows])
    weights = {name: p.grad for name, p in model.named_parameters()}
    sent_rows = sum(r.numel() for r in plan.send.values())
    result = {"out": out.detach(), "x": local.grad, "weights": weights, "sent": counter.sent}
    torch.save({**result, "halo": plan.num_halo, "send_rows": sent_rows}, Path(out_dir) / f"{rank}.pt")
