"""Graph random features ``Φ̂ = Σ_t f_t P_t`` and the explicit mask ``M̂ = Φ̂Φ̂ᵀ``, differentiable in f."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from kmipgt.grf.edge_sums import CHUNK_BYTES
from kmipgt.grf.sparse import CSRPattern, index_dtype
from kmipgt.grf.walks import GRFWalks

__all__ = [
    "GRFMaskPattern", "grf_feature_values", "grf_features", "grf_mask", "grf_mask_pattern", "grf_mask_values",
]


def grf_features(walks: GRFWalks, f: Tensor) -> Tensor:
    """Combine the per-step loads of ``walks`` with the modulation function ``f``.

    Row i of the result is node i's graph random feature ``φ̂(v_i)``; ``Φ̂Φ̂ᵀ`` is an unbiased estimate
    (off the diagonal, or exactly with independent walks on the two sides) of ``Σ_k α_k W^k`` with
    ``α = f * f``. The sparsity pattern comes from the frozen walks; the values are
    ``Σ_t f_t P_t[i, u]`` (:func:`grf_feature_values`) and carry autograd back to ``f``.

    Args:
        walks: output of :func:`kmipgt.grf.sample_walks`.
        f: ``[max_len + 1]`` one modulation vector, or ``[H, max_len + 1]`` one per head. Keep it
            non-negative (e.g. softplus) so that the mask and the attention normaliser stay positive.

    Returns:
        Coalesced sparse COO tensor ``[N, N]`` for 1-D ``f``, or ``[H, N, N]`` (one matrix per head,
        all sharing the walks' pattern) for 2-D ``f``.
    """
    values = grf_feature_values(walks, f)
    n = walks.num_nodes
    if f.dim() == 1:
        pairs = walks.pairs.long()  # sparse COO tensors take int64 indices only
        return torch.sparse_coo_tensor(pairs, values, (n, n), is_coalesced=True, check_invariants=False)
    heads = f.shape[0]
    return torch.sparse_coo_tensor(
        walks.head_indices(heads), values.flatten(), (heads, n, n), is_coalesced=True, check_invariants=False
    )


def grf_feature_values(walks: GRFWalks, f: Tensor) -> Tensor:
    """The values of :func:`grf_features` alone: ``Σ_t f_t P_t[i, u]`` at the walks' ``pairs``.

    What the explicit-mask route needs (:func:`kmipgt.grf.pattern_masked_attention`): it never builds the
    sparse tensor, whose per-head int64 indices (``[3, H·P]``) would be kept for the whole run.

    Args:
        walks: output of :func:`kmipgt.grf.sample_walks`.
        f: ``[max_len + 1]`` or ``[H, max_len + 1]``, as in :func:`grf_features`.

    Returns:
        ``[P]`` for 1-D ``f``, ``[H, P]`` for 2-D ``f``, in the order of ``walks.pairs``.
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
    load = walks.load.to(f.dtype)
    if f.dim() == 1:
        contributions = f[walks.step] * load
        return contributions.new_zeros(walks.nnz).index_add(0, walks.pair_index, contributions)
    contributions = f[:, walks.step] * load
    return contributions.new_zeros(f.shape[0], walks.nnz).index_add(1, walks.pair_index, contributions)


@dataclass(frozen=True)
class GRFMaskPattern:
    """Sparsity pattern of ``M̂ = Φ̂Φ̂ᵀ`` and the products of ``Φ̂`` entries that sum into each entry.

    ``M̂_ij = Σ_u Φ̂_iu Φ̂_ju``: every pair of nonzeros of ``Φ̂`` that share a column u adds one product.
    Built once per set of walks; :func:`grf_mask` then assembles ``M̂`` for any f in O(pairs).

    Indices are int32 where they fit (below 2^31), int64 otherwise: like the walks, the pattern lives
    as long as the graph.

    Attributes:
        num_nodes: N.
        indices: ``[2, M]`` int32 ``(i, j)`` nonzeros of ``M̂``, sorted row-major.
        left: ``[Q]`` int32 position of ``Φ̂_iu`` among the walks' ``pairs``.
        right: ``[Q]`` int32 position of ``Φ̂_ju``.
        entry: ``[Q]`` int32 column of ``indices`` that the product ``Φ̂_iu Φ̂_ju`` adds to.
    """

    num_nodes: int
    num_features: int
    indices: Tensor
    left: Tensor
    right: Tensor
    entry: Tensor

    _block_patterns: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def nnz(self) -> int:
        """Nonzeros of ``M̂``."""
        return int(self.indices.shape[1])

    def block_pattern(self, heads: int) -> CSRPattern:
        """CSR pattern of ``M̂`` repeated on the diagonal of an ``[H·N, H·N]`` matrix (cached per H), int32
        where ``H·N`` and ``H·M`` fit."""
        if heads not in self._block_patterns:
            dtype = index_dtype(max(heads * self.num_nodes, heads * self.nnz))
            head = torch.arange(heads, device=self.indices.device, dtype=dtype)
            offset = head.repeat_interleave(self.nnz) * self.num_nodes
            block = self.indices.to(dtype).repeat(1, heads) + offset
            self._block_patterns[heads] = CSRPattern.from_indices(block, heads * self.num_nodes)
        return self._block_patterns[heads]


def grf_mask_pattern(walks: GRFWalks) -> GRFMaskPattern:
    """The pattern of ``M̂ = Φ̂Φ̂ᵀ`` for features built from ``walks`` (any f, any number of heads).

    Its size is ``Σ_u c_u²`` products for ``c_u`` walk visits to node u: about 18 N on a grid with 4
    walkers and ``p_halt = 0.5``, but it grows with the square of the walk budget.
    """
    if not isinstance(walks, GRFWalks):
        raise TypeError(f"`walks` must be a GRFWalks from sample_walks, got {type(walks).__name__}")
    n = walks.num_nodes
    # int64 while building: the keys below reach N², and positions may exceed int32 before the compaction.
    row, col = walks.pairs.long()
    order = torch.argsort(col, stable=True)
    sorted_col = col[order]
    counts = torch.bincount(col, minlength=n)
    first = counts.cumsum(0) - counts
    partners = counts[sorted_col]
    left_sorted = torch.repeat_interleave(torch.arange(row.numel(), device=row.device), partners)
    offsets = torch.repeat_interleave(partners.cumsum(0) - partners, partners)
    within = torch.arange(left_sorted.numel(), device=row.device) - offsets
    right_sorted = first[sorted_col[left_sorted]] + within
    left, right = order[left_sorted], order[right_sorted]
    keys, entry = torch.unique(row[left] * n + row[right], return_inverse=True)
    indices = torch.stack([keys // n, keys % n])
    # Products sorted by their target entry make the per-forward scatter-add cache-friendly.
    by_entry = torch.argsort(entry, stable=True)
    position = index_dtype(max(row.numel(), keys.numel()))
    left, right, entry = (t[by_entry].to(position) for t in (left, right, entry))
    return GRFMaskPattern(n, walks.nnz, indices.to(index_dtype(n - 1)), left, right, entry)


def grf_mask(features: Tensor, pattern: GRFMaskPattern) -> Tensor:
    """The explicit sparse mask ``M̂ = Φ̂Φ̂ᵀ`` (per head), with autograd to the values of ``features``.

    Args:
        features: ``grf_features(walks, f)``: sparse ``[N, N]`` or ``[H, N, N]``.
        pattern: ``grf_mask_pattern(walks)`` of the same walks.

    Returns:
        Coalesced sparse COO ``[N, N]`` or ``[H, N, N]`` with ``pattern.nnz`` nonzeros per head.
    """
    n = pattern.num_nodes
    mask = grf_mask_values(feature_values(features, pattern), pattern)
    heads = mask.shape[0]
    pattern_indices = pattern.indices.long()  # sparse COO tensors take int64 indices only
    if features.dim() == 2:
        return torch.sparse_coo_tensor(
            pattern_indices, mask[0], (n, n), is_coalesced=True, check_invariants=False
        )
    head = torch.arange(heads, device=mask.device).repeat_interleave(pattern.nnz)
    indices = torch.cat([head[None], pattern_indices.repeat(1, heads)])
    return torch.sparse_coo_tensor(
        indices, mask.flatten(), (heads, n, n), is_coalesced=True, check_invariants=False
    )


def grf_mask_values(
    feature_values: Tensor, pattern: GRFMaskPattern, *, chunk_size: int | None = None
) -> Tensor:
    """``[H, M]`` values of ``M̂`` at ``pattern.indices`` from the ``[H, P]`` values of ``Φ̂``.

    The ``Q`` products are formed ``chunk_size`` at a time (``None``: about ``CHUNK_BYTES`` per chunk), so
    no ``[H, Q]`` temporary exists (75 MB per gather at N = 2^18 with 4 heads); every chunk size gives
    the same values and gradients, bit for bit on CPU.
    """
    if chunk_size is None:
        chunk_size = max(1, CHUNK_BYTES // (feature_values.element_size() * max(feature_values.shape[0], 1)))
    if chunk_size < 1:
        raise ValueError(f"`chunk_size` must be positive, got {chunk_size}")
    return _MaskValues.apply(feature_values, pattern, chunk_size)


class _MaskValues(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values, pattern, chunk_size):
        ctx.save_for_backward(values)
        ctx.pattern, ctx.chunk_size = pattern, chunk_size
        out = values.new_zeros(values.shape[0], pattern.nnz)
        for part in _product_chunks(pattern, chunk_size):
            products = values[:, pattern.left[part]] * values[:, pattern.right[part]]
            out.index_add_(1, pattern.entry[part], products)
        return out

    @staticmethod
    def backward(ctx, grad):
        (values,) = ctx.saved_tensors
        pattern = ctx.pattern
        grad_values = torch.zeros_like(values)
        # All left factors first, then all right ones: the accumulation order of one unchunked pass.
        for target, other in ((pattern.left, pattern.right), (pattern.right, pattern.left)):
            for part in _product_chunks(pattern, ctx.chunk_size):
                grad_values.index_add_(1, target[part], grad[:, pattern.entry[part]] * values[:, other[part]])
        return grad_values, None, None


def _product_chunks(pattern: GRFMaskPattern, chunk_size: int) -> list[slice]:
    """Consecutive slices of ``chunk_size`` products (the last one shorter)."""
    total = pattern.left.numel()
    return [slice(start, min(start + chunk_size, total)) for start in range(0, total, chunk_size)]


def feature_values(features: Tensor, pattern: GRFMaskPattern) -> Tensor:
    """``[H, P]`` values of a ``grf_features`` output (H = 1 for ``[N, N]``), checked against ``pattern``."""
    if not isinstance(pattern, GRFMaskPattern):
        raise TypeError(f"`pattern` must be a GRFMaskPattern, got {type(pattern).__name__}")
    if not isinstance(features, Tensor) or features.layout != torch.sparse_coo:
        raise TypeError("`features` must be a sparse COO tensor from grf_features")
    n, p = pattern.num_nodes, pattern.num_features
    heads = features.shape[0] if features.dim() == 3 else 1
    if features.dim() not in (2, 3) or features.shape[-2:] != (n, n) or features._nnz() != heads * p:
        raise ValueError(
            f"`features` must come from the walks of `pattern`: [N, N] or [H, N, N] with N={n} and {p} "
            f"nonzeros per head, got shape {tuple(features.shape)} with {features._nnz()} nonzeros"
        )
    return features.coalesce().values().view(heads, p)
