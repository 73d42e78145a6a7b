r"""Approximate top-k inner-product search with an inverted-file (IVF) index, in torch (CPU and CUDA).

Maximum inner product is turned into nearest-neighbour search by the standard transform
(Bachrach et al., 2014): keys are scaled by the largest key norm :math:`M` and lifted to unit norm,
:math:`\hat k = [k/M,\ \sqrt{1-\|k\|^2/M^2}]`, queries are normalised and padded with a zero,
:math:`\hat q = [q/\|q\|,\ 0]`. Then :math:`\|\hat q-\hat k\|^2 = 2 - 2\,q\cdot k/(\|q\|M)`, so the nearest
lifted key is the key of largest inner product. k-means on the lifted keys gives ``nlist`` lists;
each query probes the ``nprobe`` lists of largest :math:`\hat q\cdot\hat c + r/4` (centroid
:math:`\hat c`, radius :math:`r` of the list: the largest distance from :math:`\hat c` to one of its keys)
and scores the keys in them exactly (on the CPU with the fused kernel, one segment per list; elsewhere a
matmul per list). One index per (graph, head), built on every call: the keys change at every training step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kmipgt.ops.search import ivf_common
from kmipgt.ops.search.blockwise import sort_by_score_then_index, tile_topk
from kmipgt.ops.search.fused_kernel import FUSED_DTYPES, fused_library, group_probes, probe_topk_fused
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
from kmipgt.ops.search.registry import SearchBackend, register, route, search_call

__all__ = ["topk_ivf"]
# Weight of the list radius in the probe score q̂·ĉ + w·r: k-means leaves far-out keys, often the best ones,
# in lists whose centroid is far from them, while the full ball bound (w = 1) over-rewards every spread-out
# list when there is no cluster structure; a quarter keeps the gain on trained tokens (docs/search.md).
_RADIUS_WEIGHT = 0.25
# Transient elements per chunk of the probe phase (gathered queries + candidates), ~256 MB in float32.
_CHUNK_ELEMENTS = 1 << 26


def _top_centroids(points: Tensor, centroids: Tensor, bias: Tensor, count: int) -> Tensor:
    """``[P, count]`` indices of the centroids with the largest ``x·c + bias_c`` for each point ``x``.

    With ``bias = -|c|²/2`` these are the nearest centroids by L2. On the CPU one exact search of
    ``[x, 1]`` among ``[c, bias]`` with the fused kernel, which never writes the ``[P, nlist]`` score matrix
    (faster than ``addmm`` + torch's CPU ``topk``: docs/search.md, "Approximate search"); elsewhere
    ``addmm`` + ``argmax``/``topk`` in chunks.
    """
    if points.device.type == "cpu" and points.dtype == torch.float32 and fused_library() is not None:
        lifted_points = torch.cat([points, points.new_ones(points.shape[0], 1)], dim=-1)[:, None]
        lifted_centroids = torch.cat([centroids, bias[:, None]], dim=-1)[:, None]
        num_points = points.shape[0]
        _, index = probe_topk_fused(
            lifted_points,
            lifted_centroids,
            count,
            torch.tensor([0, centroids.shape[0]]),
            torch.tensor([0, num_points]),
            torch.arange(num_points),
        )
        index = index[:, 0]
        # The kernel selects nothing (-1) for a NaN score, and -1 would make group_probes write out of
        # bounds (the process aborted with check_finite=False and a NaN input). Such rows probe the first
        # lists instead: results for non-finite inputs are unspecified, but stay within their graph.
        index[(index < 0).any(-1)] = torch.arange(count)
        return index
    chunk = max(1, _CHUNK_ELEMENTS // (4 * centroids.shape[0]))
    out = []
    for i in range(0, points.shape[0], chunk):
        affinity = torch.addmm(bias, points[i : i + chunk], centroids.T)
        # argmax is several times faster than topk(1) on the CPU, and this runs every k-means step.
        out.append(affinity.argmax(-1, keepdim=True) if count == 1 else affinity.topk(count, dim=-1).indices)
    return torch.cat(out) if out else points.new_zeros((0, count), dtype=torch.long)


def _nearest_centroids(points: Tensor, centroids: Tensor, count: int) -> Tensor:
    """``[P, count]`` indices of the nearest centroids by L2 (= largest ``x·c - |c|²/2``)."""
    return _top_centroids(points, centroids, -0.5 * centroids.pow(2).sum(-1), count)


def _list_radii(points: Tensor, centroids: Tensor, assign: Tensor) -> Tensor:
    """``[nlist]`` largest distance from each centroid to a point assigned to it (0 for empty lists)."""
    distance = (points - centroids[assign]).norm(dim=-1)
    return distance.new_zeros(centroids.shape[0]).scatter_reduce(0, assign, distance, reduce="amax")


def _kmeans(points: Tensor, nlist: int, generator: torch.Generator) -> Tensor:
    """``[nlist, e]`` centroids of Lloyd's k-means on a random subsample, initialised at sample points."""
    order = torch.randperm(points.shape[0], generator=generator)[: nlist * TRAIN_POINTS_PER_LIST]
    sample = points[order.to(points.device)]
    centroids = sample[:nlist].clone()
    for _ in range(KMEANS_ITERATIONS):
        assign = _nearest_centroids(sample, centroids, 1)[:, 0]
        counts = torch.bincount(assign, minlength=nlist)
        # Sums per list as differences of a running sum in sorted order: deterministic on every device
        # (scatter-adds use atomics on CUDA) and faster than index_add_ on the CPU.
        running = sample[assign.argsort(stable=True)].double().cumsum(0)
        running = torch.cat([running.new_zeros(1, running.shape[1]), running])
        ends = counts.cumsum(0)
        sums = (running[ends] - running[ends - counts]).to(centroids.dtype)
        filled = counts > 0
        # An empty list keeps its previous centroid rather than collapsing to the origin.
        centroids[filled] = sums[filled] / counts[filled, None].to(sums.dtype)
    return centroids


def _inverted_lists(
    lifted_key: Tensor, nlist: int, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """k-means lists of lifted keys: ``[nlist, e]`` centroids, ``[nlist]`` radii, ``[n]`` list of each key.

    Radii are returned weighted by :data:`_RADIUS_WEIGHT`, ready for the probe score ``q̂·ĉ + w·r``. Lists
    are numbered by decreasing ``|ĉ| + w·r``, the largest score a list can offer any query: the fused probe
    selection then meets the likely winners first and inserts less (docs/search.md, "Approximate search").
    """
    centroids = _kmeans(lifted_key, nlist, generator)
    key_list = _nearest_centroids(lifted_key, centroids, 1)[:, 0]
    radii = _RADIUS_WEIGHT * _list_radii(lifted_key, centroids, key_list)
    order = (centroids.norm(dim=-1) + radii).argsort(descending=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(nlist, device=order.device)
    return centroids[order], radii[order], rank[key_list]


def _probe_topk_torch(
    query: Tensor, sorted_keys: Tensor, k: int, key_order: Tensor, key_ptr: Tensor, probes: Tensor
) -> tuple[Tensor, Tensor]:
    """Any-device probe phase: per inverted list, ``matmul`` + top-k for its queries, then a merge per query.

    query ``[m, d]``, ``sorted_keys`` ``[n, d]`` (grouped by list), ``probes`` ``[m, nprobe]`` -> ``[m, k]``.
    """
    m, nprobe = probes.shape
    n = sorted_keys.shape[0]
    starts, ends = key_ptr[:-1].tolist(), key_ptr[1:].tolist()
    # Each chunk costs one Python iteration per list: on a GPU, fewer and larger chunks.
    elements = _CHUNK_ELEMENTS * (4 if query.device.type == "cuda" else 1)
    chunk = max(1, elements // (nprobe * (query.shape[1] + 2 * k)))
    scores_out, index_out = [], []
    for c0 in range(0, m, chunk):
        chunk_probes = probes[c0 : c0 + chunk]
        rows = chunk_probes.shape[0]
        pair_order = chunk_probes.flatten().argsort(stable=True)
        counts = torch.bincount(chunk_probes.flatten(), minlength=len(starts)).tolist()
        cand_s = query.new_full((rows * nprobe, k), float("-inf"))
        cand_i = torch.full((rows * nprobe, k), n, dtype=torch.long, device=query.device)
        offset = 0
        for start, end, count in zip(starts, ends, counts):
            pairs = pair_order[offset : offset + count]
            offset += count
            if count == 0 or end == start:
                continue
            scores = query[c0 + pairs // nprobe] @ sorted_keys[start:end].T
            values, positions = tile_topk(scores, min(k, end - start))
            cand_s[pairs, : values.shape[1]] = values
            cand_i[pairs, : values.shape[1]] = key_order[start + positions]
        # Missing candidates carry id n, so among equal (-inf) scores they sort after real keys.
        best_s, best_i = sort_by_score_then_index(cand_s.view(rows, -1), cand_i.view(rows, -1))
        scores_out.append(best_s[:, :k])
        index_out.append(torch.where(best_i[:, :k] >= n, -1, best_i[:, :k]))
    return torch.cat(scores_out), torch.cat(index_out)


def _calibrate(
    query: Tensor, key: Tensor, lifted_query: Tensor, index: tuple[Tensor, Tensor, Tensor], k: int,
    target: float, generator: torch.Generator,
) -> tuple[int, float]:
    """``(nprobe, recall)``: the fewest lists to probe for recall@k ``target`` on a sample of the queries,
    ranking every list for each sampled query by the probe score (:func:`ivf_common.calibrated_nprobe`)."""
    centroids, radii, key_list = index
    nlist = centroids.shape[0]
    rows, exact = calibration_sample(query, key, k, generator)
    order = _top_centroids(lifted_query[rows], centroids, radii, nlist)
    positions = torch.arange(nlist, device=order.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, positions)
    return calibrated_nprobe(rank.gather(1, key_list[exact]), target)


def _ivf_one(
    query: Tensor, key: Tensor, k: int, nlist: int, nprobe: int | None, seed: int, recall: float | None,
) -> tuple[Tensor, Tensor, int, float | None]:
    """IVF search of one (graph, head): query ``[m, d]``, key ``[n, d]`` -> ``[m, k]`` scores, key indices,
    the ``nprobe`` used and, with a ``recall`` target (``nprobe`` None), the sampled recall it reached."""
    m = query.shape[0]
    generator = torch.Generator().manual_seed(seed)
    work = query.float() if query.dtype in (torch.float16, torch.bfloat16) else query
    lifted_query, lifted_key = lift(work, key.to(work.dtype))
    centroids, radii, key_list = _inverted_lists(lifted_key, nlist, generator)
    reached = None
    if recall is not None:
        nprobe, reached = _calibrate(
            work, key.to(work.dtype), lifted_query, (centroids, radii, key_list), k, recall, generator
        )
    key_order = key_list.argsort(stable=True)
    key_ptr = torch.cat([key_list.new_zeros(1), torch.bincount(key_list, minlength=nlist).cumsum(0)]).cpu()
    # Lists by q̂·ĉ + w·r rather than by centroid distance (see _RADIUS_WEIGHT).
    probes = _top_centroids(lifted_query, centroids, radii, nprobe)
    sorted_keys = key[key_order]
    if query.device.type == "cpu" and query.dtype in FUSED_DTYPES and fused_library() is not None:
        block = max(96, -(-m // (4 * torch.get_num_threads())))
        # float32 throughout: the first call's scores are the second call's thresholds.
        query32, keys32 = query.float()[:, None], sorted_keys.float()[:, None]
        found = None
        # Best-scored list first: it sets a high k-th best score early, so the other lists insert little.
        for part in (probes[:, :1], probes[:, 1:]):
            if part.shape[1] == 0:
                continue
            probe_ptr, probe_query = group_probes(part, nlist)
            found = probe_topk_fused(
                query32,
                keys32,
                k,
                key_ptr,
                probe_ptr,
                probe_query,
                key_ids=key_order,
                query_block=block,
                start=found,
            )
        scores, index = found
        return scores[:, 0].to(query.dtype), index[:, 0], nprobe, reached
    # Half types are scored in float32, as by the exact backends.
    scores, index = _probe_topk_torch(work, sorted_keys.to(work.dtype), k, key_order, key_ptr, probes)
    return scores.to(query.dtype), index, nprobe, reached


def topk_ivf(
    query: Tensor,
    key: Tensor,
    k: int,
    ptr: Tensor,
    *,
    key_ptr: Tensor | None = None,
    nlist: int | None = None,
    nprobe: int | None = None,
    recall: float | None = None,
    calibration: ProbeCalibration | None = None,
    seed: int = 0,
) -> tuple[Tensor, Tensor]:
    """Approximate top-k keys per query within each graph, by an inverted-file index per (graph, head).

    Args:
        query: ``[M, H, d]`` queries (any float dtype, CPU or CUDA).
        key: ``[N, H, d]`` keys.
        k: keys per query.
        ptr: ``[G + 1]`` validated CSR offsets of the queries' graphs.
        key_ptr: ``[G + 1]`` offsets of the keys' graphs; default ``ptr`` (the queries are the nodes).
        nlist: inverted lists per (graph, head); default :func:`default_nlist` of the graph's key count,
            clamped to it.
        nprobe: a fixed number of lists probed per query (clamped to ``nlist``; ``nprobe >= nlist`` is
            exact), instead of a recall target; nothing is calibrated.
        recall: the recall@k target in (0, 1] each index calibrates its ``nprobe`` to; default
            :data:`ivf_common.DEFAULT_RECALL` (0.95) unless ``nprobe`` is given. It probes the fewest lists
            that reach it on :data:`ivf_common.CALIBRATION_QUERIES` sampled queries, against the exact
            top-k of those queries, with a margin for the sampling error
            (:func:`ivf_common.calibrated_nprobe`). ``1.0`` runs the exact search instead of an index.
        calibration: filled, when given, with the ``nprobe`` and the sampled recall of every
            (graph, head) index that was calibrated.
        seed: seed of the k-means initialisation (results are deterministic for fixed inputs).

    Returns:
        ``(scores, index)``: ``[M, H, k]`` descending exact scores of the keys found and their int64
        global indices; ``-inf``/``-1`` where fewer than k keys were found (graphs with fewer than k keys,
        or probed lists holding fewer than k keys). Graphs below ``ivf_common.IVF_MIN_NODES`` keys, and
        every graph with ``recall=1.0``, are searched exactly (by the ``auto`` backend).
    """
    check_option("nlist", nlist)
    check_option("nprobe", nprobe)
    ivf_common.check_recall(recall, nprobe)
    num_queries, heads, _ = query.shape
    query, key = query.detach(), key.detach()
    scores_out = query.new_full((num_queries, heads, k), float("-inf"))
    index_out = torch.full((num_queries, heads, k), -1, dtype=torch.long, device=query.device)
    queries_differ = key_ptr is not None
    key_ptr = ptr if key_ptr is None else key_ptr
    sizes, key_sizes = (ptr[1:] - ptr[:-1]).tolist(), (key_ptr[1:] - key_ptr[:-1]).tolist()
    # Graphs with queries and keys, by key count (with M == N every non-empty graph).
    searched = [g for g, (size, key_size) in enumerate(zip(sizes, key_sizes)) if size > 0 and key_size > 0]
    target = probe_target(recall, nprobe)
    # Recall 1 asks for every true key: the exact search finds them faster than an index probing every list.
    exact = [g for g in searched if key_sizes[g] < ivf_common.IVF_MIN_NODES or target == 1]
    if exact:
        _search_exactly(query, key, k, ptr, key_ptr, exact, queries_differ, (scores_out, index_out))
    for g in sorted(set(searched) - set(exact)):
        (q0, q1), (k0, k1) = ptr[g : g + 2].tolist(), key_ptr[g : g + 2].tolist()
        lists = min(k1 - k0, nlist if nlist is not None else default_nlist(k1 - k0))
        probes = None if nprobe is None else min(lists, nprobe)
        for h in range(heads):
            scores, index, used, reached = _ivf_one(
                query[q0:q1, h], key[k0:k1, h], k, lists, probes, seed, target
            )
            if calibration is not None and reached is not None:
                calibration.add(used, reached)
            scores_out[q0:q1, h] = scores
            index_out[q0:q1, h] = torch.where(index >= 0, index + k0, -1)
    return scores_out, index_out


def _search_exactly(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, key_ptr: Tensor, graphs: list[int], queries_differ: bool,
    out: tuple[Tensor, Tensor],
) -> None:
    """Exact search (by the backend ``auto`` routes this batch to) of the small ``graphs``, gathered into
    one batch, written into ``out``."""

    def rows_of(layout: Tensor) -> Tensor:
        return torch.cat([torch.arange(int(layout[g]), int(layout[g + 1])) for g in graphs]).to(query.device)

    def offsets(layout: Tensor) -> Tensor:
        sizes = torch.tensor([int(layout[g + 1] - layout[g]) for g in graphs])
        return torch.cat([torch.zeros(1, dtype=torch.long), sizes.cumsum(0)])

    rows, key_rows = rows_of(ptr), rows_of(key_ptr)
    small_ptr, small_key_ptr = offsets(ptr), offsets(key_ptr)
    exact = route(search_call(query, k, small_key_ptr, queries_differ=queries_differ))
    layout = {"key_ptr": small_key_ptr} if queries_differ else {}
    scores, index = exact.search(query[rows], key[key_rows], k, small_ptr, **layout)
    found = index >= 0
    index[found] = key_rows[index[found]]
    out[0][rows], out[1][rows] = scores, index


register(SearchBackend(
    name="ivf", search=topk_ivf, exact=False, available=lambda: True, queries_differ=True
))
