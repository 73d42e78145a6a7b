"""Exact top-k inner-product search over ragged graphs without an N×N score matrix."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from kmipgt.ops.ragged import graph_blocks, graph_ptr, node_graph_bounds

__all__ = ["APPROXIMATE_BACKENDS", "SEARCH_BACKENDS", "exact_search", "require_finite", "topk_inner_product"]

Backend = Literal["auto", "torch", "dense", "keops", "fused", "triton", "ivf", "faiss"]
SEARCH_BACKENDS: tuple[str, ...] = ("auto", "torch", "dense", "keops", "fused", "triton", "ivf", "faiss")
# Backends that may miss some of the true top-k (their recall is reported by `kmipgt bench search`).
APPROXIMATE_BACKENDS: tuple[str, ...] = ("ivf", "faiss")

# Small graphs are searched together (masked) so a batch of many molecules is a few matmuls.
MIN_BLOCK_NODES = 512
# Working-set bounds of the blockwise search, in score elements: a query tile times a key tile.
# Measured on a 2-core CPU: 64 MB tiles beat 4-16 MB ones (fewer topk/merge passes); on GPU larger
# tiles amortise kernel launches.
_TILE_ELEMENTS = {"cpu": 1 << 24, "cuda": 1 << 26}
_KEY_TILE = {"cpu": 1 << 15, "cuda": 1 << 16}


def check_query_key(query: Tensor, key: Tensor, k: int) -> None:
    """Raise TypeError/ValueError unless query/key are matching [N, H, d] floats (H, d >= 1) and k >= 1."""
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
    if query.shape != key.shape:
        raise ValueError(
            f"`query` and `key` must have the same shape [N, H, d], got {tuple(query.shape)} and "
            f"{tuple(key.shape)}"
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
            (inverted-file index in torch, :func:`kmipgt.ops.ivf_search.topk_ivf`), ``"faiss"``
            (faiss ``IndexIVFFlat`` on the same transform; needs the ``faiss`` extra).
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
    if backend not in SEARCH_BACKENDS:
        raise ValueError(f"`backend` must be one of {SEARCH_BACKENDS}, got {backend!r}")
    if backend not in APPROXIMATE_BACKENDS and (nlist is not None or nprobe is not None):
        raise ValueError(f"`nlist`/`nprobe` only apply to backends {APPROXIMATE_BACKENDS}, got {backend!r}")
    if backend == "auto":
        return exact_search(query, key, k, ptr)
    if backend == "torch":
        return _topk_torch(query, key, k, ptr)
    if backend == "dense":
        return _topk_blockwise(query, key, k, ptr, tile_elements=None, key_tile=None)
    if backend == "keops":
        from kmipgt.ops.keops_search import topk_keops

        return topk_keops(query, key, k, ptr)
    if backend == "fused":
        return _topk_fused_or_torch(query, key, k, ptr)
    if backend == "triton":
        from kmipgt.ops.triton_search import topk_triton

        return topk_triton(query, key, k, ptr)
    if backend == "ivf":
        from kmipgt.ops.ivf_search import topk_ivf

        return topk_ivf(query, key, k, ptr, nlist=nlist, nprobe=nprobe)
    from kmipgt.ops.faiss_search import topk_faiss

    return topk_faiss(query, key, k, ptr, nlist=nlist, nprobe=nprobe)


def exact_search(query: Tensor, key: Tensor, k: int, ptr: Tensor) -> tuple[Tensor, Tensor]:
    """The fastest exact search for the device and dtype (``backend="auto"``); inputs already validated."""
    from kmipgt.ops.fused_search import FUSED_DTYPES, fused_library

    if query.device.type == "cpu" and query.dtype in FUSED_DTYPES and fused_library() is not None:
        from kmipgt.ops.fused_search import topk_fused

        return topk_fused(query, key, k, ptr)
    if query.device.type == "cuda":
        from kmipgt.ops.triton_search import TRITON_DTYPES, triton_available

        if query.dtype in TRITON_DTYPES and triton_available():
            from kmipgt.ops.triton_search import topk_triton

            return topk_triton(query, key, k, ptr)
    return _topk_torch(query, key, k, ptr)


def _topk_torch(query: Tensor, key: Tensor, k: int, ptr: Tensor) -> tuple[Tensor, Tensor]:
    device = query.device.type if query.device.type in _TILE_ELEMENTS else "cuda"
    return _topk_blockwise(query, key, k, ptr, _TILE_ELEMENTS[device], _KEY_TILE[device])


def _topk_fused_or_torch(query: Tensor, key: Tensor, k: int, ptr: Tensor) -> tuple[Tensor, Tensor]:
    from kmipgt.ops.fused_search import FUSED_DTYPES, fused_library, topk_fused

    if query.device.type != "cpu":
        raise ValueError(f"backend='fused' is the CPU kernel, got tensors on {query.device}; use 'triton'")
    if query.dtype not in FUSED_DTYPES:
        raise TypeError(f"backend='fused' takes {FUSED_DTYPES}, got {query.dtype}; use backend='torch'")
    # fused_library() has warned when the kernel cannot be built on this machine.
    if fused_library() is None:
        return _topk_torch(query, key, k, ptr)
    return topk_fused(query, key, k, ptr)


def sort_by_score_then_index(scores: Tensor, index: Tensor) -> tuple[Tensor, Tensor]:
    """Order the last axis by decreasing score, ties by increasing index (two stable sorts)."""
    order = index.argsort(dim=-1, stable=True)
    scores, index = scores.gather(-1, order), index.gather(-1, order)
    order = scores.argsort(dim=-1, descending=True, stable=True)
    return scores.gather(-1, order), index.gather(-1, order)


def _tile_topk(scores: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Exact top-k positions along the last axis; a tie at the k-th place goes to the lower position.

    ``torch.topk`` leaves the choice among tied scores unspecified, so rows where the k-th and
    (k+1)-th scores are equal are redone with a stable sort; such rows are rare for float data.
    """
    width = scores.shape[-1]
    if k >= width:
        return scores.sort(dim=-1, descending=True, stable=True)
    values, positions = scores.topk(k + 1, dim=-1)
    tied = values[..., k - 1] == values[..., k]
    values, positions = values[..., :k], positions[..., :k]
    if bool(tied.any()):
        rows = tied.nonzero(as_tuple=True)
        exact_values, exact_positions = scores[rows].sort(dim=-1, descending=True, stable=True)
        values[rows], positions[rows] = exact_values[..., :k], exact_positions[..., :k]
    return values, positions


def _merge_topk(best: tuple[Tensor, Tensor], new: tuple[Tensor, Tensor], k: int) -> tuple[Tensor, Tensor]:
    scores, index = sort_by_score_then_index(
        torch.cat([best[0], new[0]], -1), torch.cat([best[1], new[1]], -1)
    )
    return scores[..., :k], index[..., :k]


def _topk_blockwise(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, tile_elements: int | None, key_tile: int | None
) -> tuple[Tensor, Tensor]:
    num_nodes, heads, _ = query.shape
    scores_out = query.new_full((num_nodes, heads, k), float("-inf"))
    index_out = torch.full((num_nodes, heads, k), -1, dtype=torch.long, device=query.device)
    lo, hi = node_graph_bounds(ptr, query.device)
    # Half types are ranked in float32 like the fused and Triton kernels do: a float16 product overflows
    # at 65,504 and ties every large score at inf, which would select by index instead of by score.
    rank_dtype = torch.promote_types(query.dtype, torch.float32)
    query_h, key_h = query.transpose(0, 1).to(rank_dtype), key.transpose(0, 1).to(rank_dtype)
    blocks = graph_blocks(ptr, MIN_BLOCK_NODES)
    for block in blocks:
        size = block.end - block.start
        kt = size if key_tile is None else min(size, key_tile)
        qt = size if tile_elements is None else max(1, tile_elements // (heads * kt))
        for q0 in range(block.start, block.end, qt):
            q1 = min(q0 + qt, block.end)
            best = None
            for k0 in range(block.start, block.end, kt):
                k1 = min(k0 + kt, block.end)
                scores = torch.matmul(query_h[:, q0:q1], key_h[:, k0:k1].transpose(1, 2))
                if block.multi:
                    keys = torch.arange(k0, k1, device=query.device)
                    same_graph = (keys >= lo[q0:q1, None]) & (keys < hi[q0:q1, None])
                    scores.masked_fill_(~same_graph, float("-inf"))
                values, positions = _tile_topk(scores, k)
                tile = (values, positions + k0)
                best = tile if best is None else _merge_topk(best, tile, k)
            values, index = sort_by_score_then_index(*best)
            width = values.shape[-1]
            scores_out[q0:q1, :, :width] = values.transpose(0, 1)
            index_out[q0:q1, :, :width] = index.transpose(0, 1)
    if any(block.multi for block in blocks):
        foreign = (index_out < lo[:, None, None]) | (index_out >= hi[:, None, None])
        index_out.masked_fill_(foreign, -1)
        scores_out.masked_fill_(foreign, float("-inf"))
    return scores_out, index_out
