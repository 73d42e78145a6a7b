"""Inputs of the sharded-attention tests and the rank function that runs them (spawned ranks import it).

Every rank draws the whole batch from the case's seed and keeps its own rows; the test process draws the
same batch and runs the single-process :func:`kmipgt.ops.kmip_attention` on all of it as the reference.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from kmipgt.distributed import count_communication, sharded_kmip_attention


@dataclass(frozen=True)
class Case:
    """Graph sizes of the global batch, rows per rank, heads, dims, k, and how ranks pass the graphs."""

    sizes: tuple[int, ...]
    split: tuple[int, ...]
    heads: int
    dim: int
    k: int
    layout: str  # "ptr": the global offsets on every rank; "batch": each rank's global graph ids
    remote_topk: bool = False  # keys placed so that every query's top-k lies on the other rank
    ties: bool = False  # small integers: exact float products, many tied scores (broken by global index)


def _cases() -> dict[str, Case]:
    cases = {}
    for k in (1, 16):
        cases[f"one_graph_1000_k{k}"] = Case((1000,), (500, 500), 2, 8, k, "ptr")
        # Graph 2 (rows 300:750) straddles the boundary at 400; graphs of 7 and 3 nodes are smaller than k.
        cases[f"ragged_1000_k{k}"] = Case((7, 293, 450, 3, 247), (400, 600), 2, 8, k, "batch")
        cases[f"ragged_ptr_1000_k{k}"] = Case((7, 293, 450, 3, 247), (600, 400), 2, 8, k, "ptr")
        cases[f"remote_topk_1000_k{k}"] = Case((1000,), (500, 500), 2, 8, k, "ptr", remote_topk=True)
        cases[f"one_graph_10000_k{k}"] = Case((10000,), (5000, 5000), 1, 4, k, "ptr")
        cases[f"ties_1000_k{k}"] = Case((100, 900), (500, 500), 2, 2, k, "batch", ties=True)
    return cases


CASES = _cases()


def case_inputs(case: Case) -> tuple[torch.Tensor, ...]:
    """``query, key, value, grad_out`` ``[N, H, d]`` (float32) and the global ``ptr`` ``[G + 1]``."""
    gen = torch.Generator().manual_seed(sum(case.sizes) + case.k)
    n = sum(case.sizes)
    query, key, value, grad_out = (torch.randn(n, case.heads, case.dim, generator=gen) for _ in range(4))
    if case.ties:
        shape = (n, case.heads, case.dim)
        query, key = (torch.randint(-3, 4, shape, generator=gen).float() for _ in range(2))
    if case.remote_topk:
        # Rank 0's queries point along +e0 and its keys along -e0, rank 1's the other way round: every
        # query's largest inner products are with the other rank's keys.
        sign = torch.ones(n)
        sign[case.split[0]:] = -1.0
        query[:, :, 0] = sign[:, None] * (2.0 + query[:, :, 0].abs())
        key[:, :, 0] = -sign[:, None] * (10.0 + key[:, :, 0].abs())
    ptr = torch.tensor([0, *torch.tensor(case.sizes).cumsum(0).tolist()])
    return query, key, value, grad_out, ptr


def run_cases(rank: int, world: int, names: list[str], out_dir: str) -> None:
    """On each rank: sharded forward and backward of every case; saves output, gradients and bytes sent."""
    for name in names:
        case = CASES[name]
        query, key, value, grad_out, ptr = case_inputs(case)
        start = sum(case.split[:rank])
        rows = slice(start, start + case.split[rank])
        batch = torch.repeat_interleave(torch.arange(len(case.sizes)), torch.tensor(case.sizes))[rows]
        layout = {"ptr": ptr} if case.layout == "ptr" else {"batch": batch}
        q, k, v = (t[rows].clone().requires_grad_() for t in (query, key, value))
        with count_communication() as counter:
            out = sharded_kmip_attention(q, k, v, case.k, **layout)
            out.backward(grad_out[rows])
        result = {"out": out.detach(), "query": q.grad, "key": k.grad, "value": v.grad, "sent": counter.sent}
        torch.save(result, Path(out_dir) / f"{name}_{rank}.pt")


def nan_on_rank_one(rank: int, world: int) -> None:
    """Rank 1 passes a NaN query; every rank must raise instead of waiting for it."""
    query = torch.randn(10, 1, 4)
    if rank == 1:
        query[3, 0, 0] = float("nan")
    sharded_kmip_attention(query, torch.randn(10, 1, 4), torch.randn(10, 1, 4), 2)


def rank_one_dies(rank: int, world: int) -> None:
    """Rank 1 fails before the collective that rank 0 waits in."""
    if rank == 1:
        raise RuntimeError("rank 1 failed on purpose")
    sharded_kmip_attention(torch.randn(10, 1, 4), torch.randn(10, 1, 4), torch.randn(10, 1, 4), 2)
