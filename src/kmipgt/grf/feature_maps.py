"""Positive feature maps ``φ`` of linear attention: ReLU, elu+1 and FAVOR+ positive random features."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["FEATURE_MAPS", "apply_feature_map", "orthogonal_random_features"]

FEATURE_MAPS = ("relu", "elu", "favor+")


def orthogonal_random_features(
    num_features: int,
    dim: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """FAVOR+ projection ``ω`` ``[num_features, dim]``: orthogonal blocks with Gaussian row norms.

    Rows within each block of ``dim`` rows are orthogonal (QR of a Gaussian matrix); row norms are
    resampled as norms of ``N(0, I_dim)`` vectors so that each row is marginally ``N(0, I_dim)``.
    """
    if num_features < 1 or dim < 1:
        raise ValueError(f"`num_features` and `dim` must be positive, got {num_features} and {dim}")
    num_blocks = math.ceil(num_features / dim)
    gaussian = torch.randn(num_blocks, dim, dim, generator=generator, device=device, dtype=dtype)
    # QR in float64, rounded once: LAPACK's float32 QR takes other vector code paths on other CPUs, so the
    # same seed would give other features on another machine.
    q, r = torch.linalg.qr(gaussian.double())
    # Householder QR leaves the signs of diag(R) arbitrary; fixing them makes Q Haar-distributed,
    # without which the directions are biased and FAVOR+ is no longer unbiased.
    q = q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]
    blocks = q.transpose(1, 2).reshape(num_blocks * dim, dim).to(dtype)
    directions = blocks[:num_features]
    norms = torch.randn(num_features, dim, generator=generator, device=device, dtype=dtype).norm(dim=1)
    return directions * norms[:, None]


def apply_feature_map(
    x: Tensor,
    feature_map: str,
    *,
    projection: Tensor | None = None,
    is_query: bool = True,
    graph: Tensor | None = None,
    num_graphs: int | None = None,
) -> Tensor:
    """Map queries or keys ``x`` ``[N, H, d]`` to non-negative features ``[N, H, m]``.

    - ``relu``: ``max(x, 0)``, m = d (the GRF paper's ViT choice).
    - ``elu``: ``elu(x) + 1``, m = d (Katharopoulos et al.).
    - ``favor+``: ``exp(ωᵀx' − ‖x'‖²/2) / √m`` with ``x' = x·d^{-1/4}`` and ``projection`` ω
      ``[m, d]`` (shared) or ``[H, m, d]``, so ``φ(q)ᵀφ(k)`` is unbiased for ``exp(qᵀk/√d)``. A max is
      subtracted in the exponent for stability: per row and head for queries, per graph and head for
      keys (``graph``: ``[N]`` graph id of each row; None: one graph; ``num_graphs``: more than the
      largest id, read from ``graph`` when not given); both cancel in the attention ratio.
      Per graph, because one constant for a whole batch would underflow the keys of a graph whose
      logits lie far below another graph's.
    """
    if feature_map == "relu":
        return torch.relu(x)
    if feature_map == "elu":
        return torch.nn.functional.elu(x) + 1.0
    if feature_map != "favor+":
        raise ValueError(f"`feature_map` must be one of {FEATURE_MAPS}, got {feature_map!r}")
    if projection is None:
        raise ValueError("`feature_map='favor+'` needs `projection` (see orthogonal_random_features)")
    dim = x.shape[-1]
    if projection.dim() not in (2, 3) or projection.shape[-1] != dim:
        raise ValueError(
            f"`projection` must have shape [m, {dim}] or [H, m, {dim}], got {tuple(projection.shape)}"
        )
    x = x * dim**-0.25
    if projection.dim() == 2:
        logits = torch.einsum("nhd,md->nhm", x, projection)
    else:
        logits = torch.einsum("nhd,hmd->nhm", x, projection)
    logits = logits - 0.5 * x.pow(2).sum(-1, keepdim=True)
    shift = logits.amax(-1, keepdim=True) if is_query else _key_shift(logits, graph, num_graphs)
    return torch.exp(logits - shift.detach()) / math.sqrt(projection.shape[-2])


def _key_shift(logits: Tensor, graph: Tensor | None, num_graphs: int | None) -> Tensor:
    """``[N or 1, H, 1]``: the largest key logit of each graph and head."""
    per_row = logits.amax(-1)
    if graph is None:
        return per_row.amax(0, keepdim=True).unsqueeze(-1)
    if num_graphs is None:  # read back from the device: callers that know the count pass it
        num_graphs = int(graph.max()) + 1 if graph.numel() else 1
    index = graph.unsqueeze(-1).expand_as(per_row)
    shift = per_row.new_full((num_graphs, per_row.shape[1]), float("-inf"))
    shift = shift.scatter_reduce(0, index, per_row, reduce="amax")
    return shift[graph].unsqueeze(-1)
