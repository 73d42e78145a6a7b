"""What the two inverted-file backends (``ivf`` in torch, ``faiss``) share: the MIPS-to-NN lift and defaults.

One setting, :data:`IVF_MIN_NODES`, applies to both; they read it from this module at call time.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["IVF_MIN_NODES", "check_option", "default_nlist", "default_nprobe", "lift"]

# Graphs this small are searched exactly: an index would cost more than it saves.
IVF_MIN_NODES = 1024


def default_nlist(num_nodes: int) -> int:
    """Lists per index: about ``2·sqrt(N)``, balancing k-means (cost ∝ nlist) against probing (∝ N/nlist)."""
    return max(1, round(2 * math.sqrt(num_nodes)))


def default_nprobe(nlist: int) -> int:
    """Lists probed per query: 1/16 of the lists (at least 8), i.e. about 1/16 of the exact work."""
    return min(nlist, max(8, nlist // 16))


def check_option(name: str, value: int | None) -> None:
    """Raise TypeError/ValueError unless the ``nlist``/``nprobe`` option ``value`` is None or an int >= 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"`{name}` must be >= 1, got {value}")


def lift(query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    """The MIPS-to-NN transform: ``[n, d+1]`` unit-norm lifted keys and normalised, zero-padded queries.

    ``query``/``key`` ``[n, d]``; returns ``(lifted_query, lifted_key)``, both ``[n, d+1]``.
    """
    norms = key.norm(dim=-1)
    scale = norms.max().clamp_min(torch.finfo(key.dtype).tiny)
    extra = (1 - (norms / scale).pow(2)).clamp_min(0).sqrt()
    lifted_key = torch.cat([key / scale, extra[:, None]], dim=-1)
    unit_query = query / query.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(query.dtype).tiny)
    lifted_query = torch.cat([unit_query, unit_query.new_zeros(query.shape[0], 1)], dim=-1)
    return lifted_query, lifted_key
