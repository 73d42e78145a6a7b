"""torch.distributed: query-sharded k-MIP attention and the bytes it sends.

Only torch.distributed collectives and PyTorch's launchers (``torchrun``); no transport of our own.
See ``docs/distributed.md``.
"""

from kmipgt.distributed.attention import sharded_kmip_attention
from kmipgt.distributed.counter import CommunicationCounter, count_communication

__all__ = ["CommunicationCounter", "count_communication", "sharded_kmip_attention"]
