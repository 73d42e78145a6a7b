"""What the two inverted-file backends (``ivf`` in torch, ``faiss``) share: the MIPS-to-NN lift and defaults.

One setting, :data:`IVF_MIN_NODES`, applies to both; they read it from this module at call time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

__all__ = [
    "IVF_MIN_NODES",
    "ProbeCalibration",
    "calibration_quantile",
    "check_option",
    "check_recall",
    "default_nlist",
    "default_nprobe",
    "lift",
]

# Graphs this small are searched exactly: an index would cost more than it saves.
IVF_MIN_NODES = 1024


def default_nlist(num_nodes: int) -> int:
    """Lists per index: about ``2·sqrt(N)``, balancing k-means (cost ∝ nlist) against probing (∝ N/nlist)."""
    return max(1, round(2 * math.sqrt(num_nodes)))


def default_nprobe(nlist: int) -> int:
    """Lists probed per query: 1/16 of the lists (at least 8), i.e. about 1/16 of the exact work."""
    return min(nlist, max(8, nlist // 16))


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


def calibration_quantile(target: float, pairs: int) -> int:
    """Position in the sorted needed-probe ranks of ``pairs`` sampled (query, true key) pairs to cover.

    Covering ``target`` of the sample would reach the target on the sample only; two standard errors
    of a sampled proportion are added so that the recall over all queries reaches it as well.
    """
    margin = 2 * math.sqrt(target * (1 - target) / max(pairs, 1))
    return min(pairs, math.ceil(min(1.0, target + margin) * pairs)) - 1


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
