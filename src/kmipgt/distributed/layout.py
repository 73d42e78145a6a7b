"""Which rows each rank owns in a global node-major batch, and which keys of a rank's block its queries see.

Rank r owns the contiguous rows ``offsets[r]:offsets[r + 1]`` of the global batch. Graphs are contiguous
too, so only a rank's first and last graph can straddle a boundary: the keys of another rank's block that
a query may see are that block's rows in this rank's first graph (blocks before it) or last graph (blocks
after it). Each rank therefore needs only five integers per rank, never the other ranks' graph ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kmipgt.distributed.ring import Ring
from kmipgt.ops import graph_ptr

__all__ = ["ShardLayout", "check_local_batch", "shard_layout"]


@dataclass(frozen=True)
class ShardLayout:
    """This rank's place in the global batch and the graph bounds of every rank's block.

    ``offsets``: ``[P + 1]`` global row offsets of the ranks' blocks. ``first_graph``/``last_graph``: ``[P]``
    global ids of each block's first and last graph; ``first_count``/``last_count``: ``[P]`` rows of the
    block in them. ``local_ptr``: ``[G_r + 1]`` offsets of this rank's graphs (``first_graph[rank]`` to
    ``last_graph[rank]``) in its own rows.
    """

    rank: int
    offsets: list[int]
    first_graph: list[int]
    first_count: list[int]
    last_graph: list[int]
    last_count: list[int]
    local_ptr: Tensor

    def rows(self, source: int) -> int:
        return self.offsets[source + 1] - self.offsets[source]

    def visible_keys(self, source: int) -> tuple[int, int, Tensor | None] | None:
        """Rows ``start:end`` of block ``source`` sharing a graph with this rank's queries, and their layout.

        Returns ``(start, end, key_ptr)`` with ``key_ptr`` ``[G_r + 1]`` over this rank's graphs (None for its
        own block: the keys are laid out as the queries), or None when no key of the block is visible.
        """
        if source == self.rank:
            return 0, self.rows(source), None
        if source < self.rank and self.last_graph[source] == self.first_graph[self.rank]:
            start, end, slot = self.rows(source) - self.last_count[source], self.rows(source), 0
        elif source > self.rank and self.first_graph[source] == self.last_graph[self.rank]:
            start, end, slot = 0, self.first_count[source], self.local_ptr.numel() - 2
        else:
            return None
        key_ptr = torch.zeros_like(self.local_ptr)
        key_ptr[slot + 1:] = end - start
        return start, end, key_ptr


def _local_graph_ids(
    num_rows: int, offset: int, total: int, ptr: Tensor | None, batch: Tensor | None
) -> Tensor:
    """``[n_r]`` global graph id of each local row, from the global ``ptr`` or the local ``batch``."""
    if batch is not None:
        return batch.detach().cpu().long()
    if ptr is None:
        return torch.zeros(num_rows, dtype=torch.long)
    ptr = graph_ptr(total, ptr=ptr)
    rows = torch.arange(offset, offset + num_rows)
    return torch.searchsorted(ptr, rows, right=True) - 1


def check_local_batch(num_rows: int, batch: Tensor | None) -> None:
    """ValueError/TypeError unless ``batch`` is ``[n_r]`` sorted non-negative integer graph ids."""
    if batch is None:
        return
    if not isinstance(batch, Tensor):
        raise TypeError(f"`batch` must be a torch.Tensor, got {type(batch).__name__}")
    if batch.numel() == 0:  # a rank without rows: the row counts' exchange reports it on every rank
        return
    if int(batch.min()) < 0:
        raise ValueError("`batch` must hold non-negative graph ids")
    # Validated as a PyG batch of local ids: the global ids less the first one.
    graph_ptr(num_rows, batch=batch - batch.min())


def shard_layout(
    num_rows: int, ptr: Tensor | None, batch: Tensor | None, ring: Ring, device: torch.device,
    error: Exception | None,
) -> ShardLayout:
    """Exchange the ranks' row counts and graph bounds (two all-gathers of a few integers).

    ``error``: this rank's input error, if any; every rank raises when any rank has one, so a bad input on
    one rank never leaves the others waiting in a collective.
    """
    sizes = ring.all_gather_ints([num_rows, error is None], device, "metadata")
    failed = [r for r in range(ring.size) if not bool(sizes[r, 1])]
    if error is not None:
        raise error
    if failed:
        raise ValueError(f"sharded_kmip_attention: bad input on rank(s) {failed} (see that rank's error)")
    if bool((sizes[:, 0] == 0).any()):
        raise ValueError(f"every rank must own at least one row, got rows per rank {sizes[:, 0].tolist()}")
    offsets = [0, *sizes[:, 0].cumsum(0).tolist()]
    graphs = _local_graph_ids(num_rows, offsets[ring.rank], offsets[-1], ptr, batch)
    first, last = int(graphs[0]), int(graphs[-1])
    counts = (int((graphs == first).sum()), int((graphs == last).sum()))
    bounds = ring.all_gather_ints([first, counts[0], last, counts[1]], device, "metadata")
    if bool((bounds[1:, 0] < bounds[:-1, 2]).any()):
        raise ValueError("graph ids must be sorted across ranks: rank r + 1 starts at or after r's last")
    local = torch.bincount(graphs - first, minlength=last - first + 1)
    return ShardLayout(
        ring.rank, offsets, bounds[:, 0].tolist(), bounds[:, 1].tolist(), bounds[:, 2].tolist(),
        bounds[:, 3].tolist(), torch.cat([local.new_zeros(1), local.cumsum(0)]),
    )
