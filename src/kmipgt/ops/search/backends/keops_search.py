"""Exact top-k search with KeOps symbolic matrices (the reference implementation's route).

KeOps' ``argKmin`` streams the score matrix through registers, so memory is ``O(N·k)``. Its order
among tied scores is unspecified; the selected keys are re-scored and ordered by (score, index), but a
tie at the k-th place may pick a different key than the torch backend.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from kmipgt.ops.search.blockwise import sort_by_score_then_index
from kmipgt.ops.search.registry import SearchBackend, importable, register

__all__ = ["topk_keops"]


def _lazy_tensor_class():
    try:
        from pykeops.torch import LazyTensor
    except ImportError as error:
        raise ImportError(
            "backend='keops' needs pykeops: install the extra with `pip install 'kmipgt[keops]'` "
            "(KeOps also needs a C++ compiler, and nvcc for CUDA tensors)"
        ) from error
    return LazyTensor


def topk_keops(query: Tensor, key: Tensor, k: int, ptr: Tensor) -> tuple[Tensor, Tensor]:
    """KeOps ``argKmin`` per graph; same contract as :func:`kmipgt.ops.topk_inner_product`.

    Args:
        query: ``[N, H, d]``. key: ``[N, H, d]``. k: keys per query. ptr: ``[G + 1]`` CPU offsets.

    Returns:
        ``[N, H, k]`` scores and int64 indices, ``-inf``/``-1`` where a graph has fewer than k nodes.
    """
    lazy_tensor = _lazy_tensor_class()
    num_nodes, heads, _ = query.shape
    scores_out = query.new_full((num_nodes, heads, k), float("-inf"))
    index_out = torch.full((num_nodes, heads, k), -1, dtype=torch.long, device=query.device)
    offsets = ptr.tolist()
    for start, end in itertools.pairwise(offsets):
        if end == start:
            continue
        width = min(k, end - start)
        q = query[start:end].transpose(0, 1).contiguous()
        key_g = key[start:end].transpose(0, 1).contiguous()
        q_i = lazy_tensor(q[:, :, None, :])
        k_j = lazy_tensor(key_g[:, None, :, :])
        local = (-(q_i * k_j).sum(-1)).argKmin(width, dim=2).long()
        scores = torch.einsum("hnd,hnjd->hnj", q, key_g[torch.arange(heads)[:, None, None], local])
        scores, local = sort_by_score_then_index(scores, local)
        scores_out[start:end, :, :width] = scores.transpose(0, 1)
        index_out[start:end, :, :width] = local.transpose(0, 1) + start
    return scores_out, index_out


register(SearchBackend(
    name="keops", search=topk_keops, exact=True, available=importable("pykeops"), devices=("cpu", "cuda")
))
