"""What the ranks of a training run share: summed numbers, rows gathered in rank order, rank 0's objects."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from kmipgt.distributed.launch import Ranks

__all__ = [
    "broadcast_from_main",
    "gather_objects",
    "gather_rows",
    "run_on_main",
    "sum_across_ranks",
    "sum_gradients",
]

T = TypeVar("T")


def _device() -> torch.device:
    """Where collective tensors live: NCCL moves only CUDA tensors, gloo CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sum_across_ranks(values: Sequence[float]) -> list[float]:
    """Every rank's ``values`` summed element-wise (float64), on every rank."""
    total = torch.tensor(list(values), dtype=torch.float64, device=_device())
    dist.all_reduce(total)
    return total.tolist()


def sum_gradients(parameters: Iterable[torch.nn.Parameter]) -> None:
    """Replace every parameter's gradient by its sum over the ranks (one all-reduce of all of them).

    A parameter without a gradient on some rank counts as zeros there; one without a gradient on every
    rank keeps none, as in one process (so AdamW leaves it alone).
    """
    parameters = list(parameters)
    present = torch.tensor([p.grad is not None for p in parameters], dtype=torch.float64, device=_device())
    dist.all_reduce(present)
    summed = [p for p, ranks in zip(parameters, present.tolist()) if ranks > 0]
    if not summed:
        return
    flat = torch.cat([
        (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in summed
    ]).to(_device())
    dist.all_reduce(flat)
    for p, grad in zip(summed, flat.split([p.numel() for p in summed])):
        p.grad = grad.view_as(p).to(p.device)


def gather_rows(tensor: Tensor) -> Tensor:
    """``[Σ n_r, ...]``: every rank's ``[n_r, ...]`` rows in rank order, on every rank (n_r may differ)."""
    moved = tensor.to(_device())
    sizes = [torch.zeros((), dtype=torch.long, device=moved.device) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor(moved.shape[0], device=moved.device))
    largest = max(int(size) for size in sizes)
    # all_gather moves equal shapes: pad to the largest share, cut each back after.
    padded = moved.new_zeros((largest, *moved.shape[1:]))
    padded[: moved.shape[0]] = moved
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded)
    return torch.cat([part[: int(size)] for part, size in zip(parts, sizes)]).to(tensor.device)


def broadcast_from_main(obj: T, ranks: Ranks) -> T:
    """Rank 0's ``obj`` on every rank (pickled: for checkpoints and configs, not for hot loops)."""
    box = [obj if ranks.main else None]
    dist.broadcast_object_list(box, src=0, device=_device())
    return box[0]


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def run_on_main(fn: Callable[[], T], ranks: Ranks | None) -> T:
    """``fn()`` on rank 0 only; its result, or the exception it raised, reaches every rank. With
    ``ranks=None`` (one process) it is plain ``fn()``.

    For work that touches shared files once (checking and clearing a run directory): a failure on
    rank 0 raises the same error everywhere instead of leaving the other ranks waiting.
    """
    if ranks is None:
        return fn()
    outcome: tuple[bool, Any] = (True, None)
    if ranks.main:
        try:
            outcome = (True, fn())
        except Exception as error:  # re-raised below on every rank, rank 0 included
            outcome = (False, error)
    ok, value = broadcast_from_main(outcome, ranks)
    if not ok:
        raise value
    return value
