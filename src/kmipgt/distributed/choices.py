"""The names a config's ``distributed`` section and a partitioned model choose among, without torch.

A config is checked against these before torch loads; the modules that act on them import them from here.
"""

from __future__ import annotations

from kmipgt.nn.attention_kinds import ATTENTION_KINDS, NO_ATTENTION
from kmipgt.nn.local_kinds import LOCAL_KINDS, NO_LOCAL

__all__ = ["PARTITIONS", "STRATEGIES", "partitioned_attention_kinds", "partitioned_local_kinds"]

# `distributed.strategy` of a training config: one process, DDP over many-graph mini-batches, or one graph
# whose nodes are partitioned across the ranks.
STRATEGIES = ("none", "ddp", "graph")
# ``distributed.partition``: spatial where the graph has coordinates (auto), the stored order, or spatial.
PARTITIONS = ("auto", "contiguous", "spatial")


def partitioned_local_kinds() -> tuple[str, ...]:
    """The local MPNN kinds a partition runs: those that take ``(x_src, x_dst)`` pairs, and ``"none"``."""
    return (*(name for name, kind in LOCAL_KINDS.items() if kind.bipartite), NO_LOCAL)


def partitioned_attention_kinds() -> tuple[str, ...]:
    """The attention kinds a partition runs: those flagged ``shardable`` (k-MIP), and ``"none"``."""
    return (*(name for name, kind in ATTENTION_KINDS.items() if kind.shardable), NO_ATTENTION)
