"""torch.distributed: query-sharded k-MIP attention, halo exchange, the bytes they send, DDP glue.

Only torch.distributed collectives and PyTorch's launchers (``torchrun``); no transport of our own.
See ``docs/distributed.md``.
"""

from kmipgt.distributed.attention import sharded_kmip_attention
from kmipgt.distributed.batch_norm import GlobalBatchNorm, global_batch_norms
from kmipgt.distributed.counter import CommunicationCounter, count_communication
from kmipgt.distributed.halo import HaloPlan, halo_exchange, halo_plan

__all__ = [
    "CommunicationCounter",
    "GlobalBatchNorm",
    "HaloPlan",
    "count_communication",
    "global_batch_norms",
    "halo_exchange",
    "halo_plan",
    "sharded_kmip_attention",
]
