"""torch.distributed: query-sharded k-MIP attention, graph partitions with halo exchange, the bytes they
send, DDP glue.

Only torch.distributed collectives and PyTorch's launchers (``torchrun``); no transport of our own.
See ``docs/distributed.md``.

The names below are imported on first use (:func:`kmipgt.lazy.lazy_package`), so that
:mod:`kmipgt.distributed.choices` loads without torch: a config's ``distributed`` section is checked before
torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kmipgt.lazy import lazy_package

if TYPE_CHECKING:
    from kmipgt.distributed.attention import sharded_kmip_attention
    from kmipgt.distributed.batch_norm import GlobalBatchNorm, global_batch_norms
    from kmipgt.distributed.counter import CommunicationCounter, count_communication
    from kmipgt.distributed.graph_model import PartitionedGraphTransformer
    from kmipgt.distributed.graph_shard import GraphShard, shard_graph
    from kmipgt.distributed.halo import HaloPlan, halo_exchange, halo_plan
    from kmipgt.distributed.partition import partition_order

# Public name -> the submodule that defines it.
_SOURCES = {
    "CommunicationCounter": "counter",
    "GlobalBatchNorm": "batch_norm",
    "GraphShard": "graph_shard",
    "HaloPlan": "halo",
    "PartitionedGraphTransformer": "graph_model",
    "count_communication": "counter",
    "global_batch_norms": "batch_norm",
    "halo_exchange": "halo",
    "halo_plan": "halo",
    "partition_order": "partition",
    "shard_graph": "graph_shard",
    "sharded_kmip_attention": "attention",
}

__all__ = [
    "CommunicationCounter",
    "GlobalBatchNorm",
    "GraphShard",
    "HaloPlan",
    "PartitionedGraphTransformer",
    "count_communication",
    "global_batch_norms",
    "halo_exchange",
    "halo_plan",
    "partition_order",
    "shard_graph",
    "sharded_kmip_attention",
]


lazy_package(__name__, _SOURCES)
