"""Which nodes of one graph each rank owns: a node order whose contiguous blocks are the ranks' shares.

Sharded attention and the halo exchange work on contiguous row blocks (rank r owns rows
``offsets[r]:offsets[r + 1]``), so a partition is a node order plus block offsets. The order decides the
halo: blocks of the order as stored cut many edges, blocks of nearby nodes (recursive coordinate
bisection) only the edges along their borders. METIS (PyG's ``ClusterData``) would need pyg-lib or
torch-sparse built with METIS, which kmipgt does not depend on.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.distributed.choices import PARTITIONS

__all__ = ["PARTITIONS", "block_offsets", "partition_order", "spatial_order"]


def block_offsets(num_nodes: int, parts: int) -> list[int]:
    """``[P + 1]`` offsets of ``parts`` blocks whose sizes differ by at most one node."""
    return [rank * num_nodes // parts for rank in range(parts + 1)]


def _bisect(coords: Tensor, nodes: Tensor, ranks: range, offsets: list[int]) -> list[Tensor]:
    """The blocks of ``ranks`` from their ``nodes``: halved at the widest coordinate, recursively."""
    if len(ranks) == 1:
        return [nodes.sort().values]  # the stored order inside a block
    middle = ranks.start + len(ranks) // 2
    points = coords[nodes]
    axis = int((points.amax(0) - points.amin(0)).argmax())
    ordered = nodes[points[:, axis].argsort(stable=True)]
    cut = offsets[middle] - offsets[ranks.start]
    return [
        *_bisect(coords, ordered[:cut], range(ranks.start, middle), offsets),
        *_bisect(coords, ordered[cut:], range(middle, ranks.stop), offsets),
    ]


def spatial_order(coords: Tensor, parts: int) -> Tensor:
    """``[N]`` node ids in rank order: recursive coordinate bisection of ``coords`` ``[N, D]`` into
    ``parts`` blocks of :func:`block_offsets` sizes (each split at the widest coordinate of its nodes)."""
    offsets = block_offsets(coords.shape[0], parts)
    nodes = torch.arange(coords.shape[0])
    return torch.cat(_bisect(coords.detach().cpu().float(), nodes, range(parts), offsets))


def partition_order(
    num_nodes: int, parts: int, method: str, coords: Tensor | None
) -> tuple[Tensor, list[int]]:
    """``(order [N], offsets [P + 1])``: rank r owns nodes ``order[offsets[r]:offsets[r + 1]]``.

    ``method``: one of :data:`PARTITIONS`; ``coords`` ``[N, D]`` node positions (``spatial`` needs them,
    ``auto`` uses them when given). Deterministic, so every rank computes the same partition.
    """
    if method not in PARTITIONS:
        raise ValueError(f"distributed.partition must be one of {PARTITIONS}, got {method!r}")
    if parts > num_nodes:
        raise ValueError(f"cannot split {num_nodes} nodes over {parts} ranks: every rank needs a node")
    if method == "spatial" and coords is None:
        raise ValueError(
            "distributed.partition 'spatial' needs node coordinates (the dataset's pos or "
            "model.encoder.coord_columns)"
        )
    offsets = block_offsets(num_nodes, parts)
    if method == "contiguous" or coords is None:
        return torch.arange(num_nodes), offsets
    return spatial_order(coords, parts), offsets
