"""Approximate top-k inner-product search with faiss' ``IndexIVFFlat`` (the optional ``faiss`` extra).

faiss gets the same MIPS-to-nearest-neighbour transform as the torch IVF index
(:mod:`~kmipgt.ops.search.backends.ivf_search`, through :mod:`~kmipgt.ops.search.ivf_common`), so the two
differ only in their k-means and probing code. One index is trained per (graph, head), unlike the
reference implementation, which trained one on the first (batch, head) and reused it for all. faiss
runs on the CPU: CUDA inputs are copied to the host and the result copied back. The scores of the keys
found are recomputed exactly in torch, so they equal the exact backends' scores for the same keys.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.ops.search import ivf_common
from kmipgt.ops.search.blockwise import sort_by_score_then_index
from kmipgt.ops.search.ivf_common import check_option, default_nlist, default_nprobe, lift
from kmipgt.ops.search.registry import SearchBackend, importable, register, route, search_call

__all__ = ["topk_faiss"]


def _faiss():
    try:
        import faiss
    except ImportError as error:
        raise ImportError(
            "backend='faiss' needs faiss: install the extra with `pip install 'kmipgt[faiss]'`"
        ) from error
    return faiss


def _faiss_one(faiss, query: Tensor, key: Tensor, k: int, nlist: int, nprobe: int, seed: int) -> Tensor:
    """``[n, k]`` local indices (``-1``: not found) of one (graph, head); CPU ``query``/``key`` ``[n, d]``."""
    lifted_query, lifted_key = lift(query.float(), key.float())
    dim = lifted_key.shape[1]
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim), dim, nlist, faiss.METRIC_L2)
    index.cp.seed = seed
    # Train on every key when lists are small rather than warn about too few points per centroid.
    index.cp.min_points_per_centroid = 1
    index.train(lifted_key.numpy())
    index.add(lifted_key.numpy())
    index.nprobe = nprobe
    _, found = index.search(lifted_query.numpy(), k)
    return torch.from_numpy(found)


def topk_faiss(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, *, nlist: int | None = None, nprobe: int | None = None,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Approximate top-k keys per query within each graph with faiss, per (graph, head).

    Args and returns as :func:`~kmipgt.ops.search.backends.ivf_search.topk_ivf` (same defaults for
    ``nlist``/``nprobe``; graphs below ``ivf_common.IVF_MIN_NODES`` nodes are searched exactly). Raises
    ImportError without faiss.
    """
    faiss = _faiss()
    check_option("nlist", nlist)
    check_option("nprobe", nprobe)
    faiss.omp_set_num_threads(torch.get_num_threads())
    num_nodes, heads, _ = query.shape
    query, key = query.detach(), key.detach()
    index_out = torch.full((num_nodes, heads, k), -1, dtype=torch.long)
    sizes = (ptr[1:] - ptr[:-1]).tolist()
    for g, size in enumerate(sizes):
        start = int(ptr[g])
        if size == 0:
            continue
        if size < ivf_common.IVF_MIN_NODES:
            graph_ptr = torch.tensor([0, size])
            exact = route(search_call(query, k, graph_ptr, queries_differ=False))
            _, local = exact.search(query[start : start + size], key[start : start + size], k, graph_ptr)
            index_out[start : start + size] = torch.where(local >= 0, local + start, -1).cpu()
            continue
        lists = min(size, nlist if nlist is not None else default_nlist(size))
        probes = min(lists, nprobe if nprobe is not None else default_nprobe(lists))
        for h in range(heads):
            local = _faiss_one(
                faiss,
                query[start : start + size, h].cpu(),
                key[start : start + size, h].cpu(),
                k,
                lists,
                probes,
                seed,
            )
            index_out[start : start + size, h] = torch.where(local >= 0, local + start, -1)
    index_out = index_out.to(query.device)
    found = index_out >= 0
    safe = index_out.clamp_min(0)
    heads_idx = torch.arange(heads, device=query.device)[None, :, None]
    scores = (query[:, :, None, :] * key[safe, heads_idx]).sum(-1)
    scores = scores.masked_fill(~found, float("-inf"))
    # Unfound slots carry index num_nodes so they sort after every real key of equal (-inf) score.
    scores, index_out = sort_by_score_then_index(scores, torch.where(found, index_out, num_nodes))
    return scores, torch.where(index_out >= num_nodes, -1, index_out)


register(SearchBackend(name="faiss", search=topk_faiss, exact=False, available=importable("faiss")))
