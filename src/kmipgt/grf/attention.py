"""GRF-masked attention in O(N): the symmetric two-SpMM form and the asymmetric edge-list form.

With a sparse GRF matrix ``Φ̂`` (``[N, N]``, O(1) nonzeros per row) the mask is ``M̂ = Φ̂Φ̂ᵀ`` and

    out_i = Σ_j M̂_ij K_ij v_j / Σ_j M̂_ij K_ij,        K_ij = φ(q_i)ᵀφ(k_j).

Symmetric form (Reid et al., ICLR 2025, Eq. 7): with ``X_j = φ(k_j) [v_j, 1]ᵀ`` (``m × (d_v + 1)``),
``Σ_j M̂_ij X_j = [Φ̂ (Φ̂ᵀ X)]_i`` is two sparse-dense products, and ``out_i`` is ``φ(q_i)ᵀ`` times it,
numerator columns over the last column. The asymmetric form (App. D, Alg. 2) uses ``Φ̂`` itself as a
weighted edge list, ``M̂_ij = Φ̂_ij``, and works with softmax scores too.

Ragged batches: node-major inputs with PyG ``ptr``/``batch``; ``Φ̂`` of a batch is block-diagonal, and
the optional global term ``c · 11ᵀ`` is added per graph (``c · φ(q_i)ᵀ Σ_{j in graph(i)} X_j``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt.grf.edge_sums import FUSED_FEATURE_MAPS, normalised_kernel_attention, weighted_kernel_sums
from kmipgt.grf.feature_maps import FEATURE_MAPS, apply_feature_map
from kmipgt.grf.features import GRFMaskPattern, feature_values, grf_mask_values
from kmipgt.grf.sparse import CSRPattern, sampled_dot, sparse_dense_matmul
from kmipgt.ops.ragged import RaggedLayout, same_device

__all__ = [
    "asymmetric_masked_attention", "block_mask", "linear_attention", "masked_linear_attention",
    "pattern_masked_attention",
]

SCORES = ("softmax", *FEATURE_MAPS)


def _check_qkv(query: Tensor, key: Tensor, value: Tensor) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor) or not t.dtype.is_floating_point:
            raise TypeError(f"`{name}` must be a floating-point torch.Tensor")
        if t.dim() != 3:
            raise ValueError(f"`{name}` must have shape [N, H, d], got {tuple(t.shape)}")
    if query.shape != key.shape:
        raise ValueError(
            f"`query` and `key` must have the same shape, got {tuple(query.shape)} and {tuple(key.shape)}"
        )
    if value.shape[:2] != query.shape[:2]:
        raise ValueError(
            f"`value` must have shape [N, H, d_v] = [{query.shape[0]}, {query.shape[1]}, *], "
            f"got {tuple(value.shape)}"
        )


def _check_features(features: Tensor, num_nodes: int, heads: int) -> Tensor:
    if not isinstance(features, Tensor) or features.layout != torch.sparse_coo:
        raise TypeError("`features` must be a sparse COO tensor from grf_features")
    shape = tuple(features.shape)
    if shape not in ((num_nodes, num_nodes), (heads, num_nodes, num_nodes)):
        raise ValueError(
            f"`features` must have shape [{num_nodes}, {num_nodes}] or "
            f"[{heads}, {num_nodes}, {num_nodes}], got {shape}"
        )
    return features if features.is_coalesced() else features.coalesce()


def _graphs(
    num_nodes: int, ptr: Tensor | None, batch: Tensor | None, device: torch.device,
    layout: RaggedLayout | None = None,
) -> tuple[Tensor, int]:
    """``[N]`` graph id per node on ``device`` and the number of graphs (at least 1), from ``layout`` or else
    ``ptr`` ``[G + 1]`` or sorted ``batch`` ``[N]`` (neither: one graph). The ids are expanded on the device
    from the device offsets and the host's node count: nothing is read back, and a compiler traces them."""
    if layout is None:
        layout = RaggedLayout.from_ptr(num_nodes, device, ptr=ptr, batch=batch)
    elif ptr is not None or batch is not None:
        raise ValueError("pass either `layout` or `ptr`/`batch`, not both")
    elif not same_device(layout.device, device):
        raise ValueError(f"`layout` is for {layout.device}, the inputs are on {device}")
    elif not torch.compiler.is_compiling() and layout.num_nodes != num_nodes:
        raise ValueError(f"`layout` holds {layout.num_nodes} nodes, the inputs {num_nodes}")
    sizes, count = layout.device_ptr.diff(), layout.num_graphs
    graphs = torch.arange(count, device=sizes.device)
    # sym_max keeps a symbolic count symbolic; on a plain int the TorchDynamo of torch 2.11 cannot trace it.
    count = torch.sym_max(count, 1) if isinstance(count, torch.SymInt) else max(count, 1)
    return torch.repeat_interleave(graphs, sizes, output_size=num_nodes), count


def _head_major_features(
    x: Tensor, feature_map: str, projection: Tensor | None, is_query: bool,
    graphs: tuple[Tensor, int] | None = None,
) -> Tensor:
    """``φ(x)`` of ``[N, H, d]`` as contiguous ``[H, N, m]``. ReLU is applied in place on the head-major
    copy: one ``[H, N, d]`` allocation instead of two, each faulting in fresh pages at large N (elu + 1
    cannot: the in-place elu's backward needs its own output)."""
    if feature_map == "relu":
        return x.transpose(0, 1).clone(memory_format=torch.contiguous_format).relu_()
    graph, num_graphs = (None, None) if graphs is None else graphs
    features = apply_feature_map(
        x, feature_map, projection=projection, is_query=is_query, graph=graph, num_graphs=num_graphs
    )
    return _head_major(features)


def _head_major_ones(value: Tensor) -> Tensor:
    """``[N, H, d_v]`` -> contiguous ``[H, N, d_v + 1]`` ``[v, 1]``, in one allocation (pad, then a
    head-major copy, took two)."""
    n, heads, dim = value.shape
    out = value.new_empty(heads, n, dim + 1)
    out[..., :dim] = value.transpose(0, 1)
    out[..., dim] = 1.0
    return out


def _head_major(x: Tensor) -> Tensor:
    """``[N, H, ...]`` -> contiguous ``[H, N, ...]``: each head's rows form one block of the products."""
    return x.transpose(0, 1).contiguous()


def _global_term(
    phi_q: Tensor, phi_k: Tensor, value1: Tensor, graphs: tuple[Tensor, int], outer: Tensor | None
) -> Tensor:
    """``[H, N, e]``: ``φ(q_i)ᵀ Σ_{j in graph(i)} φ(k_j) v1_jᵀ`` (head-major inputs ``[H, N, *]``;
    ``graphs`` as :func:`_graphs` gives them)."""
    graph, num_graphs = graphs
    if num_graphs == 1:
        summary = torch.bmm(phi_k.transpose(1, 2), value1)
        return torch.bmm(phi_q, summary)
    if outer is None:
        outer = _key_value_outer(phi_k, value1)
    heads, n, m, e = outer.shape
    sums = outer.new_zeros(heads, num_graphs, m, e).index_add(1, graph, outer)
    gathered = sums[:, graph].reshape(heads * n, m, e)
    return torch.bmm(phi_q.reshape(heads * n, 1, m), gathered).view(heads, n, e)


def _key_value_outer(phi_k: Tensor, value1: Tensor) -> Tensor:
    """``[H, N, m, e]``: ``φ(k_j) [v_j, 1]ᵀ``; the last column accumulates the normaliser."""
    return phi_k[..., :, None] * value1[..., None, :]


def _block_diagonal(features: Tensor, heads: int, n: int) -> tuple[Tensor, Tensor]:
    """A sparse ``[N, N]`` (shared) or ``[H, N, N]`` as one block-diagonal ``[H·N, H·N]`` matrix:
    ``(indices [2, nnz], values)``, so every sparse product serves all heads at once. Rows stay sorted,
    as the products need.
    """
    if features.dim() == 3:
        head, row, col = features.indices()
        return torch.stack([head * n + row, head * n + col]), features.values()
    row, col = features.indices()
    offset = torch.arange(heads, device=row.device).repeat_interleave(row.numel()) * n
    return torch.stack([row.repeat(heads) + offset, col.repeat(heads) + offset]), features.values().repeat(
        heads
    )


def _normalise(out: Tensor, eps: float) -> Tensor:
    """Head-major ``[H, N, d_v + 1]`` numerators and normaliser -> ``[N, H, d_v]``."""
    return (out[..., :-1] / (out[..., -1:] + eps)).transpose(0, 1)


def _normalise_with_global(
    out: Tensor, global_weight: float, phi_q: Tensor, phi_k: Tensor, value1: Tensor,
    graphs: tuple[Tensor, int] | None, outer: Tensor | None, eps: float,
) -> Tensor:
    """:func:`_normalise` of the masked sums ``out`` plus ``global_weight ·`` :func:`_global_term` (``graphs``
    is needed only when ``global_weight > 0``)."""
    if global_weight > 0:
        out = out + global_weight * _global_term(phi_q, phi_k, value1, graphs, outer)
    return _normalise(out, eps)


def masked_linear_attention(
    query: Tensor, key: Tensor, value: Tensor, features: Tensor, *, feature_map: str = "relu",
    projection: Tensor | None = None, global_weight: float = 0.0, ptr: Tensor | None = None,
    batch: Tensor | None = None, eps: float = 1e-6, mask_pattern: GRFMaskPattern | None = None,
    chunk_rows: int | None = None,
) -> Tensor:
    """GRF-masked linear attention, symmetric form, in O(nnz(Φ̂) · m · d_v).

    ``out_i = φ(q_i)ᵀ [Φ̂(Φ̂ᵀU) + c·ΣU]_i / (φ(q_i)ᵀ [Φ̂(Φ̂ᵀZ) + c·ΣZ]_i + eps)`` with
    ``U_j = φ(k_j) v_jᵀ``, ``Z_j = φ(k_j)`` and ``Σ`` a sum over the nodes of i's graph.

    Args:
        query, key: ``[N, H, d]``.
        value: ``[N, H, d_v]``.
        features: ``Φ̂`` from :func:`kmipgt.grf.grf_features`: sparse ``[N, N]`` shared by all heads or
            ``[H, N, N]`` one per head. Must be block-diagonal over the graphs of a batch.
        feature_map: ``"relu"``, ``"elu"`` (elu + 1) or ``"favor+"``.
        projection: FAVOR+ random features ``[m, d]`` or ``[H, m, d]``; required for ``"favor+"``.
        global_weight: c ≥ 0, weight of the constant GRF coordinate (``M̂ + c·11ᵀ`` within each graph).
        ptr: ``[G + 1]`` graph offsets, or ``batch``: ``[N]`` sorted graph ids; neither = one graph.
        eps: added to the normaliser so that rows with zero mass give 0, not NaN.
        mask_pattern: ``grf_mask_pattern(walks)`` of the walks behind ``features``. Given, the same
            result is computed through the explicit sparse mask ``M̂ = Φ̂Φ̂ᵀ`` (:func:`kmipgt.grf.grf_mask`)
            and one SDDMM + one SpMM, in O(pairs + nnz(M̂) · (m + d_v)): much cheaper for small walk
            budgets (nnz(M̂) ≈ 10 N on a grid with 4 walkers), costlier when ``nnz(M̂)`` approaches
            ``nnz(Φ̂)²/N``.
        chunk_rows: with ``mask_pattern``: rows of the ``[H·N, H·N]`` block layout per chunk of the
            SDDMM + SpMM (``None``: temporaries of about 4 MiB, see :mod:`kmipgt.grf.edge_sums`). Any
            value gives the same result, bit for bit on CPU.

    Returns:
        ``[N, H, d_v]``.
    """
    _check_qkv(query, key, value)
    features = _check_features(features, query.shape[0], query.shape[1])
    if global_weight < 0:
        raise ValueError(f"`global_weight` must be non-negative, got {global_weight}")
    n, heads = query.shape[:2]
    if mask_pattern is not None:
        return pattern_masked_attention(
            query, key, value, feature_values(features, mask_pattern), mask_pattern, feature_map=feature_map,
            projection=projection, global_weight=global_weight, ptr=ptr, batch=batch, eps=eps,
            chunk_rows=chunk_rows,
        )
    phi_q = _head_major_features(query, feature_map, projection, True)
    phi_k = _head_major_features(key, feature_map, projection, False)
    value1 = _head_major_ones(value)
    outer = _key_value_outer(phi_k, value1)
    m, e = outer.shape[2:]
    indices, values = _block_diagonal(features, heads, n)
    flat = outer.view(heads * n, m * e)
    inner = sparse_dense_matmul(indices, values, flat, transpose=True)
    mixed = sparse_dense_matmul(indices, values, inner).view(heads * n, m, e)
    out = torch.bmm(phi_q.reshape(heads * n, 1, m), mixed).view(heads, n, e)
    graphs = _graphs(n, ptr, batch, query.device) if global_weight > 0 else None
    return _normalise_with_global(out, global_weight, phi_q, phi_k, value1, graphs, outer, eps)


def pattern_masked_attention(
    query: Tensor, key: Tensor, value: Tensor, feature_values: Tensor, mask_pattern: GRFMaskPattern, *,
    feature_map: str = "relu", projection: Tensor | None = None, global_weight: float = 0.0,
    ptr: Tensor | None = None, batch: Tensor | None = None, eps: float = 1e-6, chunk_rows: int | None = None,
) -> Tensor:
    """:func:`masked_linear_attention` through the explicit mask ``M̂ = Φ̂Φ̂ᵀ``, from the values of ``Φ̂``.

    The same result as ``masked_linear_attention(..., features, mask_pattern=mask_pattern)`` with
    ``feature_values = grf_feature_values(walks, f)``, without the sparse ``Φ̂``: a module that caches the
    walks then keeps no per-head int64 indices of ``Φ̂`` (``[3, H·P]``, 96 bytes per pair with 4 heads).

    Args:
        query, key: ``[N, H, d]``; value: ``[N, H, d_v]``.
        feature_values: ``[P]`` or ``[1, P]`` (shared by the heads) or ``[H, P]`` values of ``Φ̂`` at the
            walks' ``pairs`` (:func:`kmipgt.grf.grf_feature_values`).
        mask_pattern: ``grf_mask_pattern(walks)`` of the same walks (``P = mask_pattern.num_features``).
        feature_map, projection, global_weight, ptr, batch, eps, chunk_rows: as in
            :func:`masked_linear_attention`.

    Returns:
        ``[N, H, d_v]``.
    """
    _check_qkv(query, key, value)
    n, heads = query.shape[:2]
    if not isinstance(mask_pattern, GRFMaskPattern):
        raise TypeError(f"`mask_pattern` must be a GRFMaskPattern, got {type(mask_pattern).__name__}")
    if mask_pattern.num_nodes != n:
        raise ValueError(f"`mask_pattern` is for {mask_pattern.num_nodes} nodes, the tokens have {n}")
    values = feature_values.view(1, -1) if feature_values.dim() == 1 else feature_values
    p = mask_pattern.num_features
    if values.dim() != 2 or values.shape[0] not in (1, heads) or values.shape[1] != p:
        raise ValueError(
            f"`feature_values` must have shape [P], [1, P] or [{heads}, P] with P={p}, "
            f"got {tuple(feature_values.shape)}"
        )
    if feature_map not in FEATURE_MAPS:
        raise ValueError(f"`feature_map` must be one of {FEATURE_MAPS}, got {feature_map!r}")
    if global_weight < 0:
        raise ValueError(f"`global_weight` must be non-negative, got {global_weight}")
    graphs = _graphs(n, ptr, batch, query.device) if global_weight > 0 else None
    block, weights = block_mask(values, mask_pattern, heads)
    return _edge_list_attention(
        query, key, value, block, weights, feature_map, projection, None, global_weight, graphs, eps,
        chunk_rows,
    )


def block_mask(feature_values: Tensor, mask_pattern: GRFMaskPattern, heads: int) -> tuple[CSRPattern, Tensor]:
    """The explicit mask ``M̂`` of every head as one block-diagonal ``[H·N, H·N]`` matrix: its CSR pattern
    (head-major rows, cached in ``mask_pattern``) and ``[H·M]`` values, from the ``[1, P]`` or ``[H, P]``
    values of ``Φ̂`` (:func:`kmipgt.grf.grf_feature_values`)."""
    mask = grf_mask_values(feature_values, mask_pattern)
    return mask_pattern.block_pattern(heads), mask.expand(heads, -1).reshape(-1)


def linear_attention(
    query: Tensor, key: Tensor, value: Tensor, *, feature_map: str = "relu", projection: Tensor | None = None,
    ptr: Tensor | None = None, batch: Tensor | None = None, eps: float = 1e-6,
    layout: RaggedLayout | None = None,
) -> Tensor:
    """Unmasked linear attention within each graph: ``φ(q_i)ᵀ Σ_j φ(k_j)v_jᵀ / φ(q_i)ᵀ Σ_j φ(k_j)``.

    Shapes as :func:`masked_linear_attention`; the baseline GRF masking is compared against. ``layout``:
    the batch's :class:`~kmipgt.ops.ragged.RaggedLayout` in place of ``ptr``/``batch``
    (:func:`~kmipgt.ops.ragged.batch_layout`), so that nothing is read back from the device.
    """
    _check_qkv(query, key, value)
    graphs = _graphs(query.shape[0], ptr, batch, query.device, layout)
    phi_q = _head_major(apply_feature_map(query, feature_map, projection=projection, is_query=True))
    phi_k = apply_feature_map(
        key, feature_map, projection=projection, is_query=False, graph=graphs[0], num_graphs=graphs[1]
    )
    phi_k = _head_major(phi_k)
    value1 = _head_major(F.pad(value, (0, 1), value=1.0))
    return _normalise(_global_term(phi_q, phi_k, value1, graphs, None), eps)


def _edge_list_attention(
    query: Tensor, key: Tensor, value: Tensor, block: Tensor | CSRPattern, weights: Tensor, score: str,
    projection: Tensor | None, scale: float | None, global_weight: float, graphs: tuple[Tensor, int] | None,
    eps: float, chunk_rows: int | None,
) -> Tensor:
    """``Σ_j mask_ij A_ij [v_j, 1]`` over the stored entries: one SDDMM for ``A`` and one SpMM, all heads
    at once through the block-diagonal ``[H·N, H·N]`` layout ``block`` with mask values ``weights``.
    O(nnz · (d + d_v)) time, O(nnz) extra memory; feature-map scores go through
    :func:`~kmipgt.grf.edge_sums.weighted_kernel_sums` in chunks of ``chunk_rows`` rows of that layout."""
    n, heads, dim = query.shape
    indices = block if isinstance(block, CSRPattern) else CSRPattern.from_indices(block, heads * n)
    if bool((weights < 0).any()):
        raise ValueError("the mask (`features`) must be non-negative (keep f >= 0, e.g. with softplus)")
    value1 = _head_major_ones(value)
    flat_value1 = value1.view(heads * n, -1)
    if score == "softmax":
        logits = sampled_dot(
            indices, _head_major(query).view(heads * n, dim), _head_major(key).view(heads * n, dim)
        )
        logits = logits * (dim**-0.5 if scale is None else scale)
        tiny = torch.finfo(weights.dtype).tiny
        logits = torch.where(weights > 0, logits + torch.log(weights.clamp_min(tiny)), float("-inf"))
        row = indices.row
        row_max = logits.new_full((heads * n,), float("-inf")).scatter_reduce(
            0, row, logits.detach(), reduce="amax"
        )
        row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
        out = sparse_dense_matmul(indices, torch.exp(logits - row_max[row]), flat_value1).view(heads, n, -1)
        return (out[..., :-1] / out[..., -1:].clamp_min(tiny)).transpose(0, 1)
    phi_k = _head_major_features(key, score, projection, False, graphs)
    if global_weight == 0 and score in FUSED_FEATURE_MAPS:
        phi_k = phi_k.view(heads * n, -1)
        return normalised_kernel_attention(
            indices, weights, query, phi_k, flat_value1, score, eps=eps, chunk_rows=chunk_rows
        )
    phi_q = _head_major_features(query, score, projection, True)
    out = weighted_kernel_sums(
        indices, weights, phi_q.view(heads * n, -1), phi_k.view(heads * n, -1), flat_value1,
        chunk_rows=chunk_rows,
    ).view(heads, n, -1)
    return _normalise_with_global(out, global_weight, phi_q, phi_k, value1, graphs, None, eps)


def asymmetric_masked_attention(
    query: Tensor, key: Tensor, value: Tensor, features: Tensor, *, score: str = "softmax",
    projection: Tensor | None = None, scale: float | None = None, global_weight: float = 0.0,
    ptr: Tensor | None = None, batch: Tensor | None = None, eps: float = 1e-6, chunk_rows: int | None = None,
) -> Tensor:
    """GRF-masked attention, asymmetric edge-list form: ``M̂_ij = Φ̂_ij`` (keys take ``f = δ_0``).

    ``out_i = Σ_j Φ̂_ij A_ij v_j / Σ_j Φ̂_ij A_ij`` over the nonzeros of row i, with
    ``A_ij = exp(q_iᵀk_j · scale)`` (``score="softmax"``, scale defaults to ``1/√d``) or
    ``φ(q_i)ᵀφ(k_j)`` for a feature map. Cost O(nnz(Φ̂) · (d + d_v)): one sampled dot product per
    stored entry (SDDMM) and one sparse-dense product. Any non-negative sparse mask works here, e.g.
    the explicit ``M̂ = Φ̂Φ̂ᵀ`` of :func:`kmipgt.grf.grf_mask`.

    Args:
        query, key: ``[N, H, d]``; value: ``[N, H, d_v]``.
        features: sparse ``[N, N]`` or ``[H, N, N]`` with non-negative values (the walk edge list).
        score: ``"softmax"``, ``"relu"``, ``"elu"`` or ``"favor+"``.
        projection: FAVOR+ random features, required for ``"favor+"``.
        scale: softmax temperature; only for ``score="softmax"``.
        global_weight: c ≥ 0 adds ``c · A_ij`` for every j of i's graph; feature-map scores only (with
            softmax it would be full attention).
        ptr, batch: graph layout, as in :func:`masked_linear_attention`.
        eps: added to the normaliser of feature-map scores.
        chunk_rows: feature-map scores: rows of the ``[H·N, H·N]`` block layout per chunk, as in
            :func:`masked_linear_attention`.

    Returns:
        ``[N, H, d_v]``; a row without positive weight gives 0.
    """
    _check_qkv(query, key, value)
    n, heads, _ = query.shape
    features = _check_features(features, n, heads)
    if score not in SCORES:
        raise ValueError(f"`score` must be one of {SCORES}, got {score!r}")
    if global_weight < 0:
        raise ValueError(f"`global_weight` must be non-negative, got {global_weight}")
    if score == "softmax" and global_weight > 0:
        raise ValueError("`global_weight > 0` needs a feature-map `score`; with softmax it is full attention")
    graphs = _graphs(n, ptr, batch, query.device) if global_weight > 0 else None
    block, weights = _block_diagonal(features, heads, n)
    return _edge_list_attention(
        query, key, value, block, weights, score, projection, scale, global_weight, graphs, eps, chunk_rows
    )
