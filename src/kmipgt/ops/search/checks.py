"""Input checks shared by the search dispatcher and the attention functions."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["check_query_key", "require_finite"]


def check_query_key(query: Tensor, key: Tensor, k: int) -> None:
    """Raise TypeError/ValueError unless query [M, H, d] and key [N, H, d] are floats (H, d >= 1) and k >= 1.

    Whether M may differ from N depends on the graph layouts (:func:`kmipgt.ops.ragged.key_graph_ptr`).
    """
    for name, tensor in (("query", query), ("key", key)):
        if not isinstance(tensor, Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(tensor).__name__}")
        if not tensor.dtype.is_floating_point:
            raise TypeError(f"`{name}` must be a floating-point tensor, got dtype {tensor.dtype}")
        if tensor.dim() != 3:
            raise ValueError(f"`{name}` must have shape [N, H, d], got {tuple(tensor.shape)}")
        # The C++ kernel divides by d when packing keys: d = 0 would end the process with SIGFPE.
        if tensor.shape[1] == 0 or tensor.shape[2] == 0:
            raise ValueError(
                f"`{name}` must have shape [N, H, d] with H >= 1 heads and head dimension d >= 1, "
                f"got {tuple(tensor.shape)}"
            )
    if query.shape[1:] != key.shape[1:]:
        raise ValueError(
            f"`query` and `key` must have the same shape [N, H, d] apart from their rows, got "
            f"{tuple(query.shape)} and {tuple(key.shape)}"
        )
    if query.dtype != key.dtype or query.device != key.device:
        raise TypeError("`query` and `key` must share dtype and device")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"`k` must be an int, got {type(k).__name__}")
    if k < 1:
        raise ValueError(f"`k` must be >= 1, got {k}")


def require_finite(**tensors: Tensor) -> None:
    """Raise ValueError naming the first of ``tensors`` (node-major) with a NaN or inf, and its first bad row.

    One ``aminmax`` per tensor when everything is finite: min and max propagate NaN, and a single pass
    without a boolean copy costs a tenth of ``isfinite().all()`` (2.5 ms vs 25 ms for 4M floats on one core).
    The bad row is located only on failure.
    """
    for name, tensor in tensors.items():
        tensor = tensor.detach()
        if tensor.numel() == 0 or bool(torch.isfinite(torch.stack(torch.aminmax(tensor))).all()):
            continue
        row = int((~torch.isfinite(tensor)).flatten(1).any(1).nonzero()[0, 0])
        raise ValueError(
            f"`{name}` holds NaN or inf (first in row {row} of {tensor.shape[0]}); inputs must be finite "
            "(pass check_finite=False to skip this check where they are known to be)"
        )
