"""One-hop halo exchange of a graph whose nodes are split across ranks, with gradients back to the owners.

Rank r owns the contiguous nodes ``offsets[r]:offsets[r + 1]`` and the edges that end in them. A message
passing layer on rank r needs, besides its own nodes, the features of the sources of those edges owned by
other ranks: its halo. :class:`HaloPlan` works out who sends which rows to whom; :func:`halo_exchange`
sends them (point-to-point, ``batch_isend_irecv``) and, in backward, returns the halo rows' gradients to
their owners, so a layer run on ``[own nodes; halo]`` gives the own nodes' rows and gradients of the
layer run on the whole graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from kmipgt.distributed import group_release  # noqa: F401  (before any process group exists)
from kmipgt.distributed.counter import CommunicationCounter, active_counter

__all__ = ["HaloPlan", "halo_exchange", "halo_plan"]


@dataclass(frozen=True)
class HaloPlan:
    """Rank ``rank``'s part of a partitioned graph and the rows it exchanges.

    ``edge_index``: ``[2, E_r]`` the edges ending in this rank's nodes, numbered in the extended rows
    ``[own nodes (n_r); halo (h_r)]``. ``send[s]``: ``[m_s]`` own rows (local numbering) rank s needs, in
    the order of its halo; ``receive[s]``: ``(start, end)`` of the halo rows received from rank s.
    """

    rank: int
    num_nodes: int
    num_halo: int
    edge_index: Tensor
    edge_ids: Tensor
    send: dict[int, Tensor]
    receive: dict[int, tuple[int, int]]


def halo_plan(edge_index: Tensor, offsets: list[int], rank: int) -> HaloPlan:
    """The plan of ``rank`` from the global ``[2, E]`` edge index and the ``[P + 1]`` node offsets.

    Every rank derives its plan from the same global edge index, so both ends of an exchange agree on its
    rows without a request round. ``edge_ids`` ``[E_r]`` are the kept edges' positions in ``edge_index``
    (to take their features).
    """
    bounds = torch.tensor(offsets)
    owner = torch.searchsorted(bounds[1:], edge_index, right=True)  # [2, E] rank of each endpoint
    lo, hi = offsets[rank], offsets[rank + 1]
    edge_ids = (owner[1] == rank).nonzero().view(-1)
    src, dst = edge_index[0, edge_ids], edge_index[1, edge_ids]
    remote = (src < lo) | (src >= hi)
    halo = torch.unique(src[remote])  # sorted, hence grouped by owner: the offsets are contiguous
    halo_owner = torch.searchsorted(bounds[1:], halo, right=True)
    extended = torch.where(remote, hi - lo + torch.searchsorted(halo, src), src - lo)
    receive, send = {}, {}
    for peer in range(len(offsets) - 1):
        if peer == rank:
            continue
        rows = (halo_owner == peer).nonzero().view(-1)
        if rows.numel():
            receive[peer] = (hi - lo + int(rows[0]), hi - lo + int(rows[-1]) + 1)
        wanted = edge_index[0, (owner[1] == peer) & (owner[0] == rank)]
        if wanted.numel():
            send[peer] = torch.unique(wanted) - lo
    return HaloPlan(rank, hi - lo, halo.numel(), torch.stack([extended, dst - lo]), edge_ids, send, receive)


def _exchange(
    outgoing: dict[int, Tensor], incoming: dict[int, Tensor], group: dist.ProcessGroup | None,
    counter: CommunicationCounter | None, phase: str,
) -> None:
    """Post every send and receive of one exchange together and wait for them."""
    def peer(group_rank: int) -> int:
        return group_rank if group is None else dist.get_global_rank(group, group_rank)

    ops = [dist.P2POp(dist.isend, t.contiguous(), peer(p), group) for p, t in outgoing.items()]
    ops += [dist.P2POp(dist.irecv, t, peer(p), group) for p, t in incoming.items()]
    if ops:
        for request in dist.batch_isend_irecv(ops):
            request.wait()
    if counter is not None:
        counter.add(phase, sum(t.numel() * t.element_size() for t in outgoing.values()))


class _HaloExchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan, group, counter):
        halo = x.new_empty(plan.num_halo, *x.shape[1:])
        incoming = {p: halo.new_empty(end - start, *x.shape[1:]) for p, (start, end) in plan.receive.items()}
        _exchange({p: x[rows] for p, rows in plan.send.items()}, incoming, group, counter, "forward")
        for p, (start, end) in plan.receive.items():
            halo[start - plan.num_nodes:end - plan.num_nodes] = incoming[p]
        ctx.plan, ctx.group, ctx.counter = plan, group, counter
        return torch.cat([x, halo])

    @staticmethod
    def backward(ctx, grad):
        plan = ctx.plan
        grad_x = grad[:plan.num_nodes].clone()
        outgoing = {p: grad[start:end] for p, (start, end) in plan.receive.items()}
        incoming = {p: grad.new_empty(rows.numel(), *grad.shape[1:]) for p, rows in plan.send.items()}
        _exchange(outgoing, incoming, ctx.group, ctx.counter, "backward")
        for p, rows in plan.send.items():
            grad_x.index_add_(0, rows, incoming[p])
        return grad_x, None, None, None


def halo_exchange(x: Tensor, plan: HaloPlan, group: dist.ProcessGroup | None = None) -> Tensor:
    """``[n_r + h_r, ...]``: this rank's rows ``x`` ``[n_r, ...]`` followed by its halo from other ranks.

    Differentiable: in backward the halo rows' gradients go back to, and are added on, their owners.
    Bytes sent: the rows other ranks need, ``Σ_s m_s · row bytes`` each way (``count_communication``).
    """
    if x.shape[0] != plan.num_nodes:
        raise ValueError(f"`x` must hold this rank's {plan.num_nodes} nodes, got {x.shape[0]} rows")
    return _HaloExchange.apply(x, plan, group, active_counter())
