"""What the two inverted-file backends (``ivf`` in torch, ``faiss``) share: the MIPS-to-NN lift, the k-means
budget, the defaults and the calibration of ``nprobe`` to a recall target.

One setting, :data:`IVF_MIN_NODES`, applies to both; they read it from this module at call time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from kmipgt.ops.search.registry import route, search_call

__all__ = [
    "CALIBRATION_QUERIES",
    "DEFAULT_RECALL",
    "IVF_MIN_NODES",
    "KMEANS_ITERATIONS",
    "TRAIN_POINTS_PER_LIST",
    "ProbeCalibration",
    "calibrated_nprobe",
    "calibration_sample",
    "check_option",
    "check_recall",
    "default_nlist",
    "lift",
    "probe_target",
]

# Graphs this small are searched exactly: an index would cost more than it saves.
IVF_MIN_NODES = 1024
# k-means runs this many Lloyd iterations on at most this many keys per list: a bounded build, since an
# index is rebuilt on every call. A poorer clustering only costs a larger calibrated nprobe (docs/search.md,
# "How the defaults were chosen").
KMEANS_ITERATIONS = 4
TRAIN_POINTS_PER_LIST = 64
# The recall@k an approximate search calibrates to when the caller sets neither `recall` nor `nprobe`:
# whoever picks an approximate backend wants its speed (docs/search.md, "Defaults").
DEFAULT_RECALL = 0.95
# Queries per index whose exact top-k calibrates nprobe for a recall target: their mean recall has a standard
# error of about 0.005 near 0.95 (k = 16, measured), and their exact search is 256/N of an exact search.
CALIBRATION_QUERIES = 256


def default_nlist(num_nodes: int) -> int:
    """Lists per index: about ``sqrt(N)``. The centroid work (k-means, assigning keys, choosing probes) grows
    with nlist and the scan of the probed lists with N/nlist; measured on 262,144 clustered keys at recall
    0.95, ``sqrt(N)`` lists took 0.77x the time of ``2·sqrt(N)`` (docs/search.md, "How the defaults were
    chosen")."""
    return max(1, round(math.sqrt(num_nodes)))


def check_option(name: str, value: int | None) -> None:
    """Raise TypeError/ValueError unless the ``nlist``/``nprobe`` option ``value`` is None or an int >= 1."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"`{name}` must be an int or None, got {type(value).__name__}")
    if value < 1:
        raise ValueError(f"`{name}` must be >= 1, got {value}")


def lift(query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
    """The MIPS-to-NN transform: ``[n, d+1]`` unit-norm lifted keys and normalised, zero-padded queries.

    ``query``/``key`` ``[n, d]``; returns ``(lifted_query, lifted_key)``, both ``[n, d+1]``.
    """
    norms = key.norm(dim=-1)
    scale = norms.max().clamp_min(torch.finfo(key.dtype).tiny)
    extra = (1 - (norms / scale).pow(2)).clamp_min(0).sqrt()
    lifted_key = torch.cat([key / scale, extra[:, None]], dim=-1)
    unit_query = query / query.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(query.dtype).tiny)
    lifted_query = torch.cat([unit_query, unit_query.new_zeros(query.shape[0], 1)], dim=-1)
    return lifted_query, lifted_key


def check_recall(recall: float | None, nprobe: int | None) -> None:
    """Raise unless the ``recall`` target is None or a number in (0, 1], and not given with ``nprobe``."""
    if recall is None:
        return
    if isinstance(recall, bool) or not isinstance(recall, (int, float)):
        raise TypeError(f"`recall` must be a float in (0, 1] or None, got {type(recall).__name__}")
    if not 0 < recall <= 1:
        raise ValueError(f"`recall` must be in (0, 1], got {recall}")
    if nprobe is not None:
        raise ValueError("give either `recall` (nprobe calibrated per call) or `nprobe`, not both")


def probe_target(recall: float | None, nprobe: int | None) -> float | None:
    """The recall target an index calibrates ``nprobe`` to: ``recall`` if given, None for a fixed
    ``nprobe``, else :data:`DEFAULT_RECALL`."""
    if recall is not None or nprobe is not None:
        return recall
    return DEFAULT_RECALL


def calibration_sample(
    query: Tensor, key: Tensor, k: int, generator: torch.Generator
) -> tuple[Tensor, Tensor]:
    """:data:`CALIBRATION_QUERIES` sampled query rows ``[S]``, their exact top-k key rows ``[S, min(k, n)]``.

    query ``[m, d]``, key ``[n, d]`` of one (graph, head). The exact search is the one ``auto`` routes the
    sample to (on the CPU the fused kernel, which never writes the ``[S, n]`` scores).
    """
    rows = torch.randperm(query.shape[0], generator=generator)[:CALIBRATION_QUERIES].to(query.device)
    sample_ptr, key_ptr = torch.tensor([0, rows.numel()]), torch.tensor([0, key.shape[0]])
    exact = route(search_call(query, k, key_ptr, queries_differ=True))
    _, index = exact.search(query[rows, None], key[:, None], k, sample_ptr, key_ptr=key_ptr)
    return rows, index[:, 0, : min(k, key.shape[0])]


def calibrated_nprobe(list_rank: Tensor, target: float) -> tuple[int, float]:
    """``(nprobe, recall)``: the fewest lists to probe for recall@k ``target``, and the sampled recall there.

    ``list_rank`` ``[S, k]``: for each sampled query and each of its exact top-k keys, the position of the
    key's list in the query's probe order. A key is found exactly when its list is probed (probed lists are
    scored exactly), so the recall at every ``nprobe`` follows from these ranks, with no trial search.
    Reaching the target on the sample is not enough: the sampled recall less two standard errors must
    reach it, so that the recall over all queries does as well. The standard error is that of a mean over
    the sampled queries, not over (query, key) pairs: a query's keys tend to be found or missed together.
    """
    samples, width = list_rank.shape
    lists = int(list_rank.max()) + 1
    ones = torch.ones(list_rank.shape, dtype=torch.float64, device=list_rank.device)
    # found[s, p]: the share of sampled query s's true keys whose list is among its first p.
    found = ones.new_zeros(samples, lists + 1).scatter_add_(1, list_rank + 1, ones).cumsum(1) / width
    recall = found.mean(0)
    margin = 2 * found.std(0, correction=min(1, samples - 1)) / math.sqrt(samples)
    # Probing every list that holds a sampled key finds them all: recall 1 with no spread, so some p passes.
    nprobe = int((recall - margin >= target).nonzero()[0])
    return nprobe, float(recall[nprobe])


@dataclass
class ProbeCalibration:
    """What calibrated probing chose and reached: one entry per (graph, head) index of a search."""

    nprobe: list[int] = field(default_factory=list)
    recall: list[float] = field(default_factory=list)

    def add(self, nprobe: int, recall: float) -> None:
        self.nprobe.append(nprobe)
        self.recall.append(recall)

    @property
    def mean_recall(self) -> float | None:
        """Mean sampled recall over the indexes; None if none was calibrated (e.g. only small graphs)."""
        return sum(self.recall) / len(self.recall) if self.recall else None
