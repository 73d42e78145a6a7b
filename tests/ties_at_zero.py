"""Inputs whose top-k is decided by ties at a score of zero, for the search and fused attention kernels."""

from __future__ import annotations

import torch
from torch import Tensor


def ties_at_zero(dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(query, key, value)`` ``[33, 1, 16]`` in ``dtype`` and ``ptr`` of graphs of 24 and 9 nodes.

    Every third key is a zero row, alternately +0.0 and -0.0, and some queries are all negative or all
    positive, so their scores against those keys are sums of sixteen -0.0 products: a dot may return -0.0
    for them. A zero score must tie with +0.0 and rank by key index, and k = 12 cuts through the zeros. The
    head dim is 16 so that no padded column adds a +0.0 product.
    """
    gen = torch.Generator().manual_seed(7)
    sizes, dim = (24, 9), 16
    rows = sum(sizes)
    key = torch.randint(-2, 3, (rows, 1, dim), generator=gen).double()
    for row in range(0, rows, 3):
        key[row] = -0.0 if row % 2 else 0.0
    query = torch.randint(-2, 3, (rows, 1, dim), generator=gen).double()
    query[::4] = -torch.randint(1, 3, (len(range(0, rows, 4)), 1, dim), generator=gen).double()
    query[1::4] = torch.randint(1, 3, (len(range(1, rows, 4)), 1, dim), generator=gen).double()
    value = torch.randint(-2, 3, (rows, 1, 3), generator=gen).double()
    ptr = torch.tensor([0, sizes[0], rows])
    return query.to(dtype), key.to(dtype), value.to(dtype), ptr
