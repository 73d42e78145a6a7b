"""k-MIP attention on ragged graphs, and the checks and selection type it shares with full attention."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, NamedTuple, TypedDict, overload

import torch
from torch import Tensor

import kmipgt.ops.kmip_operator  # noqa: F401  (registers torch.ops.kmipgt.kmip_attention)
from kmipgt.ops.library import attention_dtypes, layout_arguments, traced_offsets
from kmipgt.ops.ragged import RaggedLayout
from kmipgt.ops.search.checks import check_query_key, require_finite
from kmipgt.ops.search.dispatch import Backend, search_layout, topk_inner_product
from kmipgt.ops.search.ivf_common import ProbeCalibration

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["AttentionSelection", "kmip_attention"]


class AttentionSelection(NamedTuple):
    """The keys a query attends to, with their scores and softmax weights (per head, best first).

    ``index``: ``[N, H, k]`` int64 global key indices (``-1`` pads where a graph has fewer than k nodes).
    ``score``: ``[N, H, k]`` inner products ``q_i · k_j`` (unscaled; ``-inf`` at padding).
    ``weight``: ``[N, H, k]`` softmax weights over the k keys (sum to 1; 0 at padding; before dropout).
    ``mass``: ``[N, H]`` share of the full softmax those k keys carry (full attention only, else None).
    """

    index: Tensor
    score: Tensor
    weight: Tensor
    mass: Tensor | None = None


class _KMIPOptions(TypedDict, total=False):
    """The keyword options of :func:`kmip_attention` other than ``return_selection`` (for its overloads)."""

    ptr: Tensor | None
    batch: Tensor | None
    key_ptr: Tensor | None
    key_batch: Tensor | None
    scale: float | None
    dropout_p: float
    backend: Backend
    nlist: int | None
    nprobe: int | None
    recall: float | None
    calibration: ProbeCalibration | None
    check_finite: bool
    layout: RaggedLayout | None


def _check_value(key: Tensor, value: Tensor) -> None:
    """Values follow the keys: one row per key."""
    if not isinstance(value, Tensor):
        raise TypeError(f"`value` must be a torch.Tensor, got {type(value).__name__}")
    if not value.dtype.is_floating_point:
        raise TypeError(f"`value` must be a floating-point tensor, got dtype {value.dtype}")
    if value.dim() != 3 or value.shape[:2] != key.shape[:2]:
        raise ValueError(
            f"`value` must have shape [N, H, d_v] = [{key.shape[0]}, {key.shape[1]}, d_v], "
            f"got {tuple(value.shape)}"
        )
    if value.device != key.device:
        raise TypeError("`value` must share dtype and device with `query`")
    # Under autocast the values may be left in another dtype (an identity value projection): the
    # operators' autocast policy casts them (kmipgt.ops.library.attention_dtypes).
    if value.dtype != key.dtype and not torch.is_autocast_enabled(key.device.type):
        raise TypeError("`value` must share dtype and device with `query`")


def _check_scale_dropout(scale: float | None, dropout_p: float) -> None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        raise TypeError(f"`scale` must be a number or None, got {type(scale).__name__}")
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)):
        raise TypeError(f"`dropout_p` must be a float, got {type(dropout_p).__name__}")
    if not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"`dropout_p` must lie in [0, 1), got {dropout_p}")


def checked_layout(
    query: Tensor, key: Tensor, value: Tensor | None, k: int, ptr: Tensor | None, batch: Tensor | None,
    scale: float | None, dropout_p: float, check_finite: bool, *, key_ptr: Tensor | None = None,
    key_batch: Tensor | None = None, layout: RaggedLayout | None = None,
) -> tuple[Tensor, Tensor | None]:
    """The checks shared by the attention functions (``value`` None: no value).

    Returns the queries' graph offsets and the keys' (:func:`~kmipgt.ops.ragged.key_graph_ptr`: None where
    they are the queries'). A ``layout`` was validated when it was built and is not checked again. While
    a model is compiled or exported only what shapes and dtypes tell is checked (values are not known
    there): the offsets come from ``layout`` or ``ptr``/``key_ptr`` as given, unvalidated.
    """
    check_query_key(query, key, k)
    if value is not None:
        _check_value(key, value)
    _check_scale_dropout(scale, dropout_p)
    if torch.compiler.is_compiling():
        return traced_offsets(ptr, batch, key_ptr, key_batch, layout)
    ptr, key_ptr = search_layout(query, key, ptr, batch, key_ptr, key_batch, layout)
    if check_finite:
        named = {"query": query, "key": key, "value": value}
        require_finite(**{name: tensor for name, tensor in named.items() if tensor is not None})
    return ptr, key_ptr


# The overloads tell type checkers that ``return_selection=True`` gives ``(output, selection)``; they take the
# other options through ``_KMIPOptions`` rather than spelling the parameter list out twice more.
@overload
def kmip_attention(
    query: Tensor, key: Tensor, value: Tensor, k: int, *,
    return_selection: Literal[False] = False, **options: Unpack[_KMIPOptions],
) -> Tensor: ...


@overload
def kmip_attention(
    query: Tensor, key: Tensor, value: Tensor, k: int, *,
    return_selection: Literal[True], **options: Unpack[_KMIPOptions],
) -> tuple[Tensor, AttentionSelection]: ...


def kmip_attention(
    query: Tensor, key: Tensor, value: Tensor, k: int, *, ptr: Tensor | None = None,
    batch: Tensor | None = None, key_ptr: Tensor | None = None, key_batch: Tensor | None = None,
    scale: float | None = None, dropout_p: float = 0.0,
    backend: Backend = "auto", nlist: int | None = None, nprobe: int | None = None,
    recall: float | None = None, calibration: ProbeCalibration | None = None,
    check_finite: bool = True, layout: RaggedLayout | None = None, return_selection: bool = False,
) -> Tensor | tuple[Tensor, AttentionSelection]:
    r"""k-MIP attention: each query attends to the k keys of its graph with largest inner product.

    .. math::
        \mathrm{out}_i = \sum_{j \in T_k(i)} \operatorname{softmax}_j(s\, q_i \cdot k_j)\, v_j,
        \qquad T_k(i) = \operatorname{argtop-}k_{j \in g(i)}\; q_i \cdot k_j

    With k at least the graph size this is exactly full softmax attention. Gradients reach query, key
    and value through the selected entries; the selection itself is piecewise constant (no gradient),
    and unselected keys and values receive zero gradient. Memory beyond the inputs is ``O(M·H·k)``.

    Args:
        query: ``[M, H, d]``. key: ``[N, H, d]``. value: ``[N, H, d_v]`` (values follow the keys). All
            node-major; ``M == N`` unless ``key_ptr``/``key_batch`` lays the keys out.
        k: keys per query (``>= 1``).
        ptr: ``[G + 1]`` graph offsets, or batch: ``[M]`` sorted graph ids of the queries; neither means
            one graph.
        key_ptr, key_batch: the keys' own graphs (the same G), as in :func:`kmipgt.ops.topk_inner_product`;
            neither: the queries' layout. A query whose graph has no keys gets output 0.
        scale: logit scale :math:`s`, default ``1/sqrt(d)``.
        dropout_p: dropout probability on the attention weights (pass 0 in evaluation).
        backend: key-search backend of :func:`kmipgt.ops.topk_inner_product` (approximate with
            ``"ivf"``/``"faiss"``: the selection may miss some of the true top-k; gradients as for exact).
            With ``"auto"``, no dropout and queries that are the keys, a batch of small graphs runs one
            fused kernel for search, softmax and sum (:mod:`kmipgt.ops.small_graphs`), with the same
            selection.
        nlist, nprobe: inverted-file options of the approximate backends.
        recall, calibration: ``"ivf"``/``"faiss"``: the recall@k target probing is calibrated to per call
            (default 0.95 unless ``nprobe`` is given; ``1.0``: the exact search), and the record of what it
            chose and reached, as in :func:`kmipgt.ops.topk_inner_product`. Inside a compiled graph the
            search runs in the operator and ``calibration`` is left empty.
        check_finite: raise ValueError naming the tensor and its first bad row when query, key or value
            holds a NaN or inf (default; one reduction per tensor, which waits for a CUDA device). With
            False, non-finite inputs give unspecified results that differ between backends.
        layout: instead of ``ptr``/``batch``, the batch's :class:`~kmipgt.ops.ragged.RaggedLayout` (queries
            are the keys), built once per batch: with it and ``check_finite=False``, a call on CUDA through
            the fused kernel or the Triton search (float32/half, k <= 128) never waits for the device; the
            torch search (float64, larger k) and the approximate backends still do.
        return_selection: also return the :class:`AttentionSelection` this call used: the searched key
            indices and scores and the softmax weights (before dropout), each ``[M, H, k']`` with
            ``k' = min(k, largest key graph)``. Costs nothing extra; off by default.

    Returns:
        ``[M, H, d_v]`` attention output, or ``(output, selection)`` with ``return_selection``.
    """
    ptr, key_ptr = checked_layout(
        query, key, value, k, ptr, batch, scale, dropout_p, check_finite, key_ptr=key_ptr,
        key_batch=key_batch, layout=layout,
    )
    query, key, value = attention_dtypes(query, key, value)
    scale = query.shape[-1] ** -0.5 if scale is None else float(scale)
    arguments = layout_arguments(layout, ptr, key_ptr)
    search = {"backend": backend, "nlist": nlist, "nprobe": nprobe, "recall": recall}
    index = score = None
    if not torch.compiler.is_compiling():
        where = {"layout": layout} if layout is not None else {"ptr": ptr, "key_ptr": key_ptr}
        if query.shape[0] == 0 or key.shape[0] == 0:
            # Searching the empty batch still checks the backend and its dtypes, so it fails like any other.
            topk_inner_product(query, key, k, **where, **search)
            out = value.new_zeros(query.shape[0], value.shape[1], value.shape[2])
            return (out, empty_selection(query)) if return_selection else out
        # Slots beyond the largest key graph would only ever hold padding (a compiled call keeps them).
        k = min(k, int((ptr if key_ptr is None else key_ptr).diff().max()))
        if calibration is not None:  # the calibration object is filled by a search run here
            with torch.no_grad():
                score, index = topk_inner_product(
                    query, key, k, **where, **search, calibration=calibration, check_finite=False
                )
    out, index, score, weight, _ = torch.ops.kmipgt.kmip_attention(
        query, key, value, k, *arguments, index, score, scale, float(dropout_p), **search
    )
    return (out, AttentionSelection(index, score, weight)) if return_selection else out


def empty_selection(query: Tensor) -> AttentionSelection:
    """The selection of queries that have no keys to select: ``[M, H, 0]``."""
    index = torch.empty(query.shape[0], query.shape[1], 0, dtype=torch.long, device=query.device)
    return AttentionSelection(index, query.new_empty(index.shape), query.new_empty(index.shape))
