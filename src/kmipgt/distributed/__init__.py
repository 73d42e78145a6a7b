"""torch.distributed: query-sharded k-MIP attention, the bytes it sends, and the glue of DDP training.

Only torch.distributed collectives and PyTorch's launchers (``torchrun``); no transport of our own.
See ``docs/distributed.md``.
"""

from kmipgt.distributed.attention import sharded_kmip_attention
from kmipgt.distributed.batch_norm import GlobalBatchNorm, global_batch_norms
from kmipgt.distributed.counter import CommunicationCounter, count_communication

__all__ = [
    "CommunicationCounter",
    "GlobalBatchNorm",
    "count_communication",
    "global_batch_norms",
    "sharded_kmip_attention",
]
