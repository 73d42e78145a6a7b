"""Point-to-point ring steps on a process group: send a block to the next rank, receive the previous one's."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import Tensor

from kmipgt.distributed import group_release  # noqa: F401  (before any process group exists)
from kmipgt.distributed.counter import CommunicationCounter

__all__ = ["Ring"]


class Ring:
    """The ranks of ``group`` in a ring: rank r sends to r + 1 and receives from r - 1 (mod P).

    Sends and receives of one step are posted together (``batch_isend_irecv``), so no rank waits for its
    neighbour to finish sending first; the bytes sent go to ``counter`` under the caller's phase.
    """

    def __init__(self, group: dist.ProcessGroup | None, counter: CommunicationCounter | None) -> None:
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        self.counter = counter

    def _global(self, group_rank: int) -> int:
        return group_rank if self.group is None else dist.get_global_rank(self.group, group_rank)

    def shift(self, tensors: Sequence[Tensor], rows: int, phase: str) -> list[Tensor]:
        """Send ``tensors`` ``[n, ...]`` to the next rank; return the previous rank's ``[rows, ...]``."""
        nxt, prev = self._global((self.rank + 1) % self.size), self._global((self.rank - 1) % self.size)
        sent = [t.contiguous() for t in tensors]
        received = [t.new_empty((rows, *t.shape[1:])) for t in sent]
        ops = [dist.P2POp(dist.isend, t, nxt, self.group) for t in sent]
        ops += [dist.P2POp(dist.irecv, t, prev, self.group) for t in received]
        for request in dist.batch_isend_irecv(ops):
            request.wait()
        if self.counter is not None:
            self.counter.add(phase, sum(t.numel() * t.element_size() for t in sent))
        return received

    def all_gather_ints(self, values: Sequence[int], device: torch.device, phase: str) -> Tensor:
        """``[P, len(values)]`` int64: every rank's ``values``, in rank order."""
        mine = torch.tensor(list(values), dtype=torch.long, device=device)
        gathered = [torch.empty_like(mine) for _ in range(self.size)]
        dist.all_gather(gathered, mine, group=self.group)
        if self.counter is not None:
            self.counter.add(phase, mine.numel() * mine.element_size() * (self.size - 1))
        return torch.stack(gathered).cpu()
