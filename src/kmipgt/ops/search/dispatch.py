"""``topk_inner_product``: top-k inner-product search over ragged graphs, by a registered backend.

The backends live in :mod:`kmipgt.ops.search.backends` and register themselves in
:mod:`kmipgt.ops.search.registry`; this module validates the inputs and hands them to one of them. An
exact search runs as the ``kmipgt::topk_inner_product`` operator (a compiled or exported model sees one
operator); the approximate ones run as Python, which records the recall they reach.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

# Imported for its side effect: every backend module registers itself.
import kmipgt.ops.search.backends  # noqa: F401
from kmipgt.ops.library import HOST_ROUTED, op_layout, traced_offsets, without_autocast
from kmipgt.ops.ragged import RaggedLayout, graph_ptr, key_graph_ptr, same_device
from kmipgt.ops.search.checks import check_query_key, require_finite
from kmipgt.ops.search.ivf_common import ProbeCalibration, check_recall
from kmipgt.ops.search.registry import SearchBackend, get_backend, registered_backends, route, search_call

__all__ = [
    "APPROXIMATE_BACKENDS", "SEARCH_BACKENDS", "Backend", "search", "search_layout", "topk_inner_product",
]

# The backend names for type checkers; tests/ops/test_registry.py checks they equal SEARCH_BACKENDS.
Backend = Literal["auto", "torch", "dense", "keops", "fused", "triton", "ivf", "faiss"]
SEARCH_BACKENDS: tuple[str, ...] = ("auto", *registered_backends())
# Backends that may miss some of the true top-k (their recall is reported by `kmipgt bench search`).
APPROXIMATE_BACKENDS: tuple[str, ...] = tuple(b.name for b in registered_backends().values() if not b.exact)


def topk_inner_product(
    query: Tensor,
    key: Tensor,
    k: int,
    *,
    ptr: Tensor | None = None,
    batch: Tensor | None = None,
    key_ptr: Tensor | None = None,
    key_batch: Tensor | None = None,
    backend: Backend = "auto",
    nlist: int | None = None,
    nprobe: int | None = None,
    recall: float | None = None,
    calibration: ProbeCalibration | None = None,
    check_finite: bool = True,
    layout: RaggedLayout | None = None,
) -> tuple[Tensor, Tensor]:
    r"""The k keys of largest inner product with each query, within the query's own graph.

    For query :math:`i` of graph :math:`g`, returns :math:`T_k(i) = \operatorname{argtop-}k_{j \in g}\,
    q_i \cdot k_j`, exactly (approximately for ``"ivf"``/``"faiss"``), ordered by decreasing score with
    ties broken by lower key index. Queries and keys are usually the same nodes (``M == N``, one layout);
    with ``key_ptr``/``key_batch`` the keys form graphs of their own (query ``i`` of graph ``g`` searches the
    keys of graph ``g``), e.g. one rank's queries against another rank's keys.

    Args:
        query: ``[M, H, d]`` queries, node-major (PyG layout), H heads.
        key: ``[N, H, d]`` keys (``N == M`` unless ``key_ptr``/``key_batch`` is given).
        k: number of keys per query (``>= 1``).
        ptr: ``[G + 1]`` CSR offsets of the queries' graphs (``Batch.ptr``).
        batch: ``[M]`` sorted graph id per query (``Batch.batch``). Neither: one graph.
        key_ptr: ``[G + 1]`` CSR offsets of the keys' graphs, or key_batch: ``[N]`` their sorted graph ids
            (the same G graphs as the queries'). Neither: the keys are laid out as the queries. Taken by
            the backends ``"torch"``, ``"dense"``, ``"fused"``, ``"ivf"`` and ``"auto"`` (which picks the
            fastest exact one); the others raise ValueError where the keys' layout differs from the queries'.
        backend: exact: ``"auto"`` (the fastest exact search that serves the call: ``"fused"`` on CPU,
            ``"triton"`` on CUDA when installed and k, the head dim and the device's shared memory allow,
            else ``"torch"``), ``"fused"`` (C++ kernel that never
            writes scores to memory, CPU; float64 is not supported), ``"triton"`` (the same on CUDA;
            needs ``triton``), ``"torch"`` (blockwise matmul + top-k, memory ``O(N·H·k)`` plus a bounded
            tile), ``"dense"`` (one score matrix per block of graphs; for tests and small inputs),
            ``"keops"`` (pykeops ``argKmin``; needs the ``keops`` extra). Approximate: ``"ivf"``
            (inverted-file index in torch, :func:`~kmipgt.ops.search.backends.ivf_search.topk_ivf`),
            ``"faiss"`` (faiss ``IndexIVFFlat`` on the same transform; needs the ``faiss`` extra).
        nlist: inverted lists per (graph, head) for ``"ivf"``/``"faiss"`` (default ``~sqrt(N_g)``).
        recall: ``"ivf"``/``"faiss"``: the recall@k target in (0, 1] (default 0.95 unless ``nprobe`` is
            given); every index probes the fewest lists reaching it on a sample of its queries, measured
            against their exact top-k. ``1.0`` returns the exact top-k.
        nprobe: ``"ivf"``/``"faiss"``, instead of ``recall``: a fixed number of lists probed per query.
        calibration: for ``"ivf"``/``"faiss"``, a :class:`~kmipgt.ops.search.ivf_common.ProbeCalibration`
            that receives the ``nprobe`` chosen and the sampled recall reached per calibrated index.
        check_finite: raise ValueError when query or key holds a NaN or inf (default). Pass False only
            where the inputs are known to be finite: results for non-finite inputs are then unspecified
            and differ between backends.
        layout: instead of ``ptr``/``batch``, the batch's :class:`~kmipgt.ops.ragged.RaggedLayout`
            (validated once, when it was built; queries are the keys): nothing is validated or read back
            from the device again, and the CUDA backend reuses the tables it built for the batch.

    Returns:
        ``(scores, index)``: ``[M, H, k]`` scores in the query dtype and ``[M, H, k]`` int64 global key
        indices in ``[0, N)``. Where a graph has fewer than k keys (or an approximate search found fewer
        than k keys) the trailing slots hold index ``-1`` and score ``-inf``. Half-precision inputs are ranked
        by float32 scores on every backend; a returned score beyond the half range saturates to ``±inf``.
    """
    check_query_key(query, key, k)
    check_recall(recall, nprobe)
    if torch.compiler.is_compiling():
        ptr, key_ptr = traced_offsets(ptr, batch, key_ptr, key_batch, layout)
    else:
        if check_finite:
            require_finite(query=query, key=key)
        ptr, key_ptr = search_layout(query, key, ptr, batch, key_ptr, key_batch, layout)
    options = {"nlist": nlist, "nprobe": nprobe, "recall": recall}
    exact = backend == "auto" or get_backend(backend).exact
    if exact and options == dict.fromkeys(options):
        device_ptr = layout.device_ptr if layout is not None and layout.device.type != "cpu" else None
        return torch.ops.kmipgt.topk_inner_product(query, key, k, ptr, key_ptr, device_ptr, backend)
    where = {"layout": layout} if layout is not None else {"ptr": ptr, "key_ptr": key_ptr}
    return search(query, key, k, **where, backend=backend, calibration=calibration, **options)


def search(
    query: Tensor, key: Tensor, k: int, *, ptr: Tensor | None = None, key_ptr: Tensor | None = None,
    layout: RaggedLayout | None = None, backend: str = "auto", nlist: int | None = None,
    nprobe: int | None = None, recall: float | None = None, calibration: ProbeCalibration | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`topk_inner_product` on checked inputs, by the backend named or routed to (no operator: what
    the operators run inside, and the approximate searches, whose calibration records what they chose).

    ``layout`` or the CPU offsets ``ptr`` (None: one graph) and ``key_ptr`` (None: the queries').
    """
    if layout is not None:
        ptr = layout.ptr
    elif ptr is None:
        ptr = torch.tensor([0, query.shape[0]])
    # Backends see `key_ptr` only where the layouts differ, so the M == N path stays that of every backend.
    options = {} if key_ptr is None else {"key_ptr": key_ptr}
    chosen = None if backend == "auto" else get_backend(backend)
    if chosen is not None and key_ptr is not None:
        _require_queries_differ(chosen)
    if chosen is not None and not chosen.exact:
        probing = {"nlist": nlist, "nprobe": nprobe, "recall": recall, "calibration": calibration}
        return chosen.search(query, key, k, ptr, **probing, **options)
    if recall is not None:
        raise ValueError(
            f"`recall` (calibrated probing) applies to backends {APPROXIMATE_BACKENDS} only, got {backend!r}"
        )
    if nlist is not None or nprobe is not None:
        raise ValueError(f"`nlist`/`nprobe` only apply to backends {APPROXIMATE_BACKENDS}, got {backend!r}")
    # Resolved after the option check: choosing may build the fused kernel.
    if chosen is None:
        keys = ptr if key_ptr is None else key_ptr
        chosen = route(search_call(query, k, keys, queries_differ=key_ptr is not None))
    if layout is not None and chosen.takes_layout:
        options = {**options, "layout": layout}
    return chosen.search(query, key, k, ptr, **options)


@torch.library.custom_op("kmipgt::topk_inner_product", mutates_args=(), tags=HOST_ROUTED)
def _topk_inner_product_op(
    query: Tensor, key: Tensor, k: int, ptr: Tensor | None, key_ptr: Tensor | None, device_ptr: Tensor | None,
    backend: str,
) -> tuple[Tensor, Tensor]:
    """The exact search on checked inputs: ``(scores, index)`` ``[M, H, k]``. ``ptr``/``key_ptr``: CPU
    offsets of the queries' and the keys' graphs (None: one graph; the queries'), ``device_ptr``: ``ptr``
    on the device where the caller has it."""
    with without_autocast(query.device):
        if key_ptr is not None:
            return search(query, key, k, ptr=ptr, key_ptr=key_ptr, backend=backend)
        layout = op_layout(query.shape[0], ptr, device_ptr, query.device)
        return search(query, key, k, layout=layout, backend=backend)


@_topk_inner_product_op.register_fake
def _(query, key, k, ptr, key_ptr, device_ptr, backend):
    slots = (query.shape[0], query.shape[1], k)
    return query.new_empty(slots), query.new_empty(slots, dtype=torch.long)


def search_layout(
    query: Tensor, key: Tensor, ptr: Tensor | None, batch: Tensor | None, key_ptr: Tensor | None,
    key_batch: Tensor | None, layout: RaggedLayout | None,
) -> tuple[Tensor, Tensor | None]:
    """The queries' ``[G + 1]`` CPU offsets and the keys' (None: the queries'), validated unless ``layout``
    already was."""
    if layout is None:
        ptr = graph_ptr(query.shape[0], ptr=ptr, batch=batch)
        return ptr, key_graph_ptr(ptr, key.shape[0], key_ptr=key_ptr, key_batch=key_batch)
    if any(given is not None for given in (ptr, batch, key_ptr, key_batch)):
        raise ValueError("pass either `layout` or `ptr`/`batch`/`key_ptr`/`key_batch`, not both")
    if not same_device(layout.device, query.device):
        raise ValueError(f"`layout` is for {layout.device}, the inputs are on {query.device}")
    if query.shape[0] != layout.num_nodes or key.shape[0] != layout.num_nodes:
        raise ValueError(
            f"`layout` holds {layout.num_nodes} nodes, got {query.shape[0]} queries and {key.shape[0]} keys"
        )
    return layout.ptr, None


def _require_queries_differ(backend: SearchBackend) -> None:
    """ValueError unless ``backend`` searches keys laid out in graphs of their own (its registry flag)."""
    if not backend.queries_differ:
        supporting = ("auto", *(b.name for b in registered_backends().values() if b.queries_differ))
        raise ValueError(
            f"backend {backend.name!r} searches only keys laid out as the queries (the same graphs, M == N); "
            f"for keys with a layout of their own (`key_ptr`/`key_batch`) use one of {supporting}"
        )
