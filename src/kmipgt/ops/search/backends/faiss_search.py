"""Approximate top-k inner-product search with faiss' ``IndexIVFFlat`` (the optional ``faiss`` extra).

faiss gets the same MIPS-to-nearest-neighbour transform as the torch IVF index
(:mod:`~kmipgt.ops.search.backends.ivf_search`, through :mod:`~kmipgt.ops.search.ivf_common`), so the two
differ only in their k-means and probing code (faiss probes the lists of the nearest centroids). Both
train k-means with the same budget, and both calibrate ``nprobe`` to a recall target by default, the same
way (:mod:`~kmipgt.ops.search.ivf_common`). One index is trained per (graph, head), unlike the
reference implementation, which trained one on the first (batch, head) and reused it for all. faiss
runs on the CPU: CUDA inputs are copied to the host and the result copied back. The scores of the keys
found are recomputed exactly in torch, so they equal the exact backends' scores for the same keys.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.ops.search import ivf_common
from kmipgt.ops.search.blockwise import sort_by_score_then_index
from kmipgt.ops.search.ivf_common import (
    KMEANS_ITERATIONS,
    TRAIN_POINTS_PER_LIST,
    ProbeCalibration,
    calibrated_nprobe,
    calibration_sample,
    check_option,
    default_nlist,
    lift,
    probe_target,
)
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


def _faiss_one(
    faiss, query: Tensor, key: Tensor, k: int, nlist: int, nprobe: int | None, target: float | None, seed: int
) -> tuple[Tensor, int, float | None]:
    """One (graph, head): CPU ``query``/``key`` ``[n, d]`` -> ``[n, k]`` local indices (``-1``: not found),
    the ``nprobe`` used and, with a recall ``target`` (``nprobe`` None), the sampled recall it reached."""
    lifted_query, lifted_key = lift(query.float(), key.float())
    dim = lifted_key.shape[1]
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim), dim, nlist, faiss.METRIC_L2)
    index.cp.seed = seed
    index.cp.niter = KMEANS_ITERATIONS
    index.cp.max_points_per_centroid = TRAIN_POINTS_PER_LIST
    # Train on every key when lists are small rather than warn about too few points per centroid.
    index.cp.min_points_per_centroid = 1
    index.train(lifted_key.numpy())
    index.add(lifted_key.numpy())
    reached = None
    if target is not None:
        rows, exact = calibration_sample(query.float(), key.float(), k, torch.Generator().manual_seed(seed))
        # faiss probes by the quantizer's order; `add` put each key in its nearest list, as assign does here.
        _, order = index.quantizer.search(lifted_query[rows].numpy(), nlist)
        key_list = torch.from_numpy(index.quantizer.assign(lifted_key[exact.flatten()].numpy(), 1))
        rank = torch.from_numpy(order).argsort(dim=1)
        nprobe, reached = calibrated_nprobe(rank.gather(1, key_list.view(exact.shape)), target)
    index.nprobe = nprobe
    _, found = index.search(lifted_query.numpy(), k)
    return torch.from_numpy(found), nprobe, reached


def topk_faiss(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, *, nlist: int | None = None, nprobe: int | None = None,
    recall: float | None = None, calibration: ProbeCalibration | None = None, seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Approximate top-k keys per query within each graph with faiss, per (graph, head).

    Args and returns as :func:`~kmipgt.ops.search.backends.ivf_search.topk_ivf` (same defaults for
    ``nlist`` and the recall target, a fixed ``nprobe`` instead of it; graphs below
    ``ivf_common.IVF_MIN_NODES`` nodes, and all with ``recall=1.0``, are searched exactly). Raises
    ImportError without faiss.
    """
    faiss = _faiss()
    check_option("nlist", nlist)
    check_option("nprobe", nprobe)
    ivf_common.check_recall(recall, nprobe)
    target = probe_target(recall, nprobe)
    faiss.omp_set_num_threads(torch.get_num_threads())
    num_nodes, heads, _ = query.shape
    query, key = query.detach(), key.detach()
    index_out = torch.full((num_nodes, heads, k), -1, dtype=torch.long)
    sizes = (ptr[1:] - ptr[:-1]).tolist()
    for g, size in enumerate(sizes):
        start = int(ptr[g])
        if size == 0:
            continue
        if size < ivf_common.IVF_MIN_NODES or target == 1:
            graph_ptr = torch.tensor([0, size])
            exact = route(search_call(query, k, graph_ptr, queries_differ=False))
            _, local = exact.search(query[start : start + size], key[start : start + size], k, graph_ptr)
            index_out[start : start + size] = torch.where(local >= 0, local + start, -1).cpu()
            continue
        lists = min(size, nlist if nlist is not None else default_nlist(size))
        probes = None if nprobe is None else min(lists, nprobe)
        for h in range(heads):
            local, used, reached = _faiss_one(
                faiss,
                query[start : start + size, h].cpu(),
                key[start : start + size, h].cpu(),
                k,
                lists,
                probes,
                target,
                seed,
            )
            if calibration is not None and reached is not None:
                calibration.add(used, reached)
            index_out[start : start + size, h] = torch.where(local >= 0, local + start, -1)
    index_out = index_out.to(query.device)
    found = index_out >= 0
    safe = index_out.clamp_min(0)
    heads_idx = torch.arange(heads, device=query.device)[None, :, None]
    # Half types are scored in float32, as by the exact backends: a float16 sum overflows beyond 65,504.
    work = query.float() if query.dtype in (torch.float16, torch.bfloat16) else query
    scores = (work[:, :, None, :] * key.to(work.dtype)[safe, heads_idx]).sum(-1)
    scores = scores.masked_fill(~found, float("-inf"))
    # Unfound slots carry index num_nodes so they sort after every real key of equal (-inf) score.
    scores, index_out = sort_by_score_then_index(scores, torch.where(found, index_out, num_nodes))
    return scores.to(query.dtype), torch.where(index_out >= num_nodes, -1, index_out)


register(SearchBackend(name="faiss", search=topk_faiss, exact=False, available=importable("faiss")))
