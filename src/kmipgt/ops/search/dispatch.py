"""``topk_inner_product``: top-k inner-product search over ragged graphs, by a registered backend.

The backends live in :mod:`kmipgt.ops.search.backends` and register themselves in
:mod:`kmipgt.ops.search.registry`; this module validates the inputs and hands them to one of them.
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

# Imported for its side effect: every backend module registers itself.
import kmipgt.ops.search.backends  # noqa: F401
from kmipgt.ops.ragged import graph_ptr
from kmipgt.ops.search.checks import check_query_key, require_finite
from kmipgt.ops.search.registry import auto_backend, get_backend, registered_backends

__all__ = ["APPROXIMATE_BACKENDS", "SEARCH_BACKENDS", "Backend", "topk_inner_product"]

# The backend names for type checkers; tests/test_ops_registry.py checks they equal SEARCH_BACKENDS.
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
    backend: Backend = "auto",
    nlist: int | None = None,
    nprobe: int | None = None,
    check_finite: bool = True,
) -> tuple[Tensor, Tensor]:
    r"""The k keys of largest inner product with each query, within the query's own graph.

    For query :math:`i` of graph :math:`g`, returns :math:`T_k(i) = \operatorname{argtop-}k_{j \in g}\,
    q_i \cdot k_j`, exactly (approximately for ``"ivf"``/``"faiss"``), ordered by decreasing score with
    ties broken by lower key index.

    Args:
        query: ``[N, H, d]`` queries, node-major (PyG layout), H heads.
        key: ``[N, H, d]`` keys.
        k: number of keys per query (``>= 1``).
        ptr: ``[G + 1]`` CSR offsets of the graphs (``Batch.ptr``).
        batch: ``[N]`` sorted graph id per node (``Batch.batch``). Neither: one graph.
        backend: exact: ``"auto"`` (the fastest exact search for the device: ``"fused"`` on CPU,
            ``"triton"`` on CUDA when installed, else ``"torch"``), ``"fused"`` (C++ kernel that never
            writes scores to memory, CPU; float64 is not supported), ``"triton"`` (the same on CUDA;
            needs ``triton``), ``"torch"`` (blockwise matmul + top-k, memory ``O(N·H·k)`` plus a bounded
            tile), ``"dense"`` (one score matrix per block of graphs; for tests and small inputs),
            ``"keops"`` (pykeops ``argKmin``; needs the ``keops`` extra). Approximate: ``"ivf"``
            (inverted-file index in torch, :func:`~kmipgt.ops.search.backends.ivf_search.topk_ivf`),
            ``"faiss"`` (faiss ``IndexIVFFlat`` on the same transform; needs the ``faiss`` extra).
        nlist: inverted lists per (graph, head) for ``"ivf"``/``"faiss"`` (default ``~2·sqrt(N_g)``).
        nprobe: lists probed per query for ``"ivf"``/``"faiss"`` (default ``nlist/16``, at least 8).
        check_finite: raise ValueError when query or key holds a NaN or inf (default). Pass False only
            where the inputs are known to be finite: results for non-finite inputs are then unspecified
            and differ between backends.

    Returns:
        ``(scores, index)``: ``[N, H, k]`` scores in the query dtype and ``[N, H, k]`` int64 global key
        indices. Where a graph has fewer than k nodes (or an approximate search found fewer than k
        keys) the trailing slots hold index ``-1`` and score ``-inf``. Half-precision inputs are ranked
        by float32 scores on every backend; a returned score beyond the half range saturates to ``±inf``.
    """
    check_query_key(query, key, k)
    if check_finite:
        require_finite(query=query, key=key)
    ptr = graph_ptr(query.shape[0], ptr=ptr, batch=batch)
    chosen = None if backend == "auto" else get_backend(backend)
    if chosen is not None and not chosen.exact:
        return chosen.search(query, key, k, ptr, nlist=nlist, nprobe=nprobe)
    if nlist is not None or nprobe is not None:
        raise ValueError(f"`nlist`/`nprobe` only apply to backends {APPROXIMATE_BACKENDS}, got {backend!r}")
    # Resolved after the option check: choosing may build the fused kernel.
    return (chosen or auto_backend(query.device.type, query.dtype)).search(query, key, k, ptr)
