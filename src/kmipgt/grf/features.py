"""Graph random features ``Φ̂ = Σ_t f_t P_t`` assembled as one sparse matrix that is differentiable in f."""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.grf.walks import GRFWalks

__all__ = ["grf_features"]


def grf_features(walks: GRFWalks, f: Tensor) -> Tensor:
    """Combine the per-step loads of ``walks`` with the modulation function ``f``.

    Row i of the result is node i's graph random feature ``φ̂(v_i)``; ``Φ̂Φ̂ᵀ`` is an unbiased estimate
    (off the diagonal, or exactly with independent walks on the two sides) of ``Σ_k α_k W^k`` with
    ``α = f * f``. The sparsity pattern comes from the frozen walks; the values are
    ``Σ_t f_t P_t[i, u]`` and carry autograd back to ``f``.

    Args:
        walks: output of :func:`kmipgt.grf.sample_walks`.
        f: ``[max_len + 1]`` one modulation vector, or ``[H, max_len + 1]`` one per head. Keep it
            non-negative (e.g. softplus) so that the mask and the attention normaliser stay positive.

    Returns:
        Coalesced sparse COO tensor ``[N, N]`` for 1-D ``f``, or ``[H, N, N]`` (one matrix per head,
        all sharing the walks' pattern) for 2-D ``f``.
    """
    if not isinstance(walks, GRFWalks):
        raise TypeError(f"`walks` must be a GRFWalks from sample_walks, got {type(walks).__name__}")
    if not isinstance(f, Tensor) or not f.dtype.is_floating_point:
        raise TypeError("`f` must be a floating-point torch.Tensor")
    if f.dim() not in (1, 2) or f.shape[-1] != walks.max_len + 1:
        raise ValueError(
            f"`f` must have shape [max_len + 1] or [H, max_len + 1] with max_len={walks.max_len}, "
            f"got {tuple(f.shape)}"
        )
    n = walks.num_nodes
    load = walks.load.to(f.dtype)
    if f.dim() == 1:
        contributions = f[walks.step] * load
        values = contributions.new_zeros(walks.nnz).index_add(0, walks.pair_index, contributions)
        return torch.sparse_coo_tensor(walks.pairs, values, (n, n), is_coalesced=True, check_invariants=False)
    heads = f.shape[0]
    contributions = f[:, walks.step] * load
    values = contributions.new_zeros(heads, walks.nnz).index_add(1, walks.pair_index, contributions)
    head = torch.arange(heads, device=f.device).repeat_interleave(walks.nnz)
    indices = torch.cat([head[None], walks.pairs.repeat(1, heads)])
    return torch.sparse_coo_tensor(
        indices, values.flatten(), (heads, n, n), is_coalesced=True, check_invariants=False
    )
