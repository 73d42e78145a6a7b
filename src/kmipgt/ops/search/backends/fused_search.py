"""Backend ``"fused"``: exact search with the C++ kernel of :mod:`kmipgt.ops.search.fused_kernel` (CPU)."""

from __future__ import annotations

from torch import Tensor

from kmipgt.ops.search.blockwise import topk_tiled
from kmipgt.ops.search.fused_kernel import FUSED_DTYPES, fused_library, topk_fused
from kmipgt.ops.search.registry import SearchBackend, register

__all__ = ["topk_fused_or_torch"]


def topk_fused_or_torch(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, *, key_ptr: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Fused-kernel search of ``[M, H, d]`` CPU queries among ``[N, H, d]`` keys -> ``[M, H, k]`` results.

    ``ptr``/``key_ptr`` lay out the queries'/keys' graphs (``key_ptr`` default ``ptr``).

    Falls back to the blockwise torch search where the kernel cannot be built (``fused_library()`` has
    warned), so ``backend="fused"`` works on every CPU; CUDA tensors and float64 are refused.
    """
    if query.device.type != "cpu":
        raise ValueError(f"backend='fused' is the CPU kernel, got tensors on {query.device}; use 'triton'")
    if query.dtype not in FUSED_DTYPES:
        raise TypeError(f"backend='fused' takes {FUSED_DTYPES}, got {query.dtype}; use backend='torch'")
    if fused_library() is None:
        return topk_tiled(query, key, k, ptr, key_ptr=key_ptr)
    return topk_fused(query, key, k, ptr, key_ptr=key_ptr)


# `available` is for `auto`: only where the kernel builds (the backend itself falls back to torch silently).
register(SearchBackend(
    name="fused", search=topk_fused_or_torch, exact=True, available=lambda: fused_library() is not None,
    devices=("cpu",), dtypes=FUSED_DTYPES, queries_differ=True, auto_rank=0,
))
