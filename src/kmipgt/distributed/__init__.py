"""torch.distributed: query-sharded k-MIP attention, graph partitions with halo exchange, the bytes they
send, DDP glue.

Only torch.distributed collectives and PyTorch's launchers (``torchrun``); no transport of our own.
See ``docs/distributed.md``.
"""

from kmipgt.distributed.attention import sharded_kmip_attention
from kmipgt.distributed.batch_norm import GlobalBatchNorm, global_batch_norms
from kmipgt.distributed.counter import CommunicationCounter, count_communication
from kmipgt.distributed.graph_model import PartitionedGraphTransformer
from kmipgt.distributed.graph_shard import GraphShard, shard_graph
from kmipgt.distributed.halo import HaloPlan, halo_exchange, halo_plan
from kmipgt.distributed.partition import partition_order

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
