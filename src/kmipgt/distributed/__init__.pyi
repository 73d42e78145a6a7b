# The public names of kmipgt.distributed, listed once. Type checkers read these imports as its re-exports
# (hence `as name`); at run time kmipgt.lazy.lazy_package reads them as __all__ and as the submodule
# each name is imported from on first use.

from .attention import sharded_kmip_attention as sharded_kmip_attention
from .batch_norm import GlobalBatchNorm as GlobalBatchNorm
from .batch_norm import global_batch_norms as global_batch_norms
from .counter import CommunicationCounter as CommunicationCounter
from .counter import count_communication as count_communication
from .graph_model import PartitionedGraphTransformer as PartitionedGraphTransformer
from .graph_shard import GraphShard as GraphShard
from .graph_shard import shard_graph as shard_graph
from .halo import HaloPlan as HaloPlan
from .halo import halo_exchange as halo_exchange
from .halo import halo_plan as halo_plan
from .launch import require_torchrun as require_torchrun
from .partition import partition_order as partition_order
