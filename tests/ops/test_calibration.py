"""IVF search with probing calibrated to a recall target, checked against exact top-k on all queries."""

from __future__ import annotations

import itertools

import pytest
import torch

from kmipgt.nn import KMIPCore
from kmipgt.ops import ProbeCalibration, topk_inner_product

N, HEADS, DIM, K = 4096, 2, 16, 8


def _tokens(kind: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``[N, H, d]`` queries and keys: Gaussian, or around 32 shared cluster centres."""
    gen = torch.Generator().manual_seed(seed)
    if kind == "gaussian":
        return tuple(torch.randn(N, HEADS, DIM, generator=gen) for _ in range(2))
    centres = 3 * torch.randn(32, HEADS, DIM, generator=gen)

    def draw():
        member = torch.randint(0, 32, (N,), generator=gen)
        return centres[member] + 0.5 * torch.randn(N, HEADS, DIM, generator=gen)

    return draw(), draw()


def _recall(index: torch.Tensor, exact: torch.Tensor) -> float:
    """Share of the exact top-k keys found, over every query and head."""
    return float((index[..., :, None] == exact[..., None, :]).any(-1).double().mean())


@pytest.mark.parametrize("kind", ["clustered", "gaussian"])
@pytest.mark.parametrize("target", [0.8, 0.95])
def test_calibrated_search_reaches_its_target_on_all_queries(kind, target):
    query, key = _tokens(kind)
    _, exact = topk_inner_product(query, key, K, backend="dense")
    calibration = ProbeCalibration()
    _, index = topk_inner_product(query, key, K, backend="ivf", recall=target, calibration=calibration)
    assert _recall(index, exact) >= target
    assert len(calibration.nprobe) == HEADS and len(calibration.recall) == HEADS
    assert min(calibration.recall) >= target
    # Not the exhaustive search in disguise: fewer lists than the default nlist = 2·sqrt(N) = 128.
    assert max(calibration.nprobe) < 128


@pytest.mark.parametrize("kind", ["clustered", "gaussian"])
def test_a_higher_target_probes_at_least_as_many_lists(kind):
    query, key = _tokens(kind, seed=1)
    chosen = []
    for target in (0.5, 0.8, 0.9, 0.95, 0.99):
        calibration = ProbeCalibration()
        topk_inner_product(query, key, K, backend="ivf", recall=target, calibration=calibration)
        chosen.append(calibration.nprobe)
    for lower, higher in itertools.pairwise(chosen):
        assert all(a <= b for a, b in zip(lower, higher, strict=True))
    assert chosen[0] != chosen[-1]


def test_calibration_is_deterministic():
    query, key = _tokens("clustered", seed=2)
    runs = []
    for _ in range(2):
        calibration = ProbeCalibration()
        _, index = topk_inner_product(query, key, K, backend="ivf", recall=0.9, calibration=calibration)
        runs.append((index, calibration))
    assert torch.equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


@pytest.mark.parametrize("target", [0.0, -0.5, 1.01, 2])
def test_bad_recall_targets_are_rejected(target):
    query, key = _tokens("gaussian")
    with pytest.raises(ValueError, match="`recall` must be in"):
        topk_inner_product(query, key, K, backend="ivf", recall=target)
    with pytest.raises(ValueError, match="`recall` must be in"):
        KMIPCore(HEADS, DIM, k=K, backend="ivf", recall=target)


def test_recall_needs_the_ivf_backend_and_no_nprobe():
    query, key = _tokens("gaussian")
    with pytest.raises(ValueError, match="'ivf' only"):
        topk_inner_product(query, key, K, backend="torch", recall=0.9)
    with pytest.raises(ValueError, match="not both"):
        topk_inner_product(query, key, K, backend="ivf", recall=0.9, nprobe=4)


def test_core_keeps_the_recall_it_reached():
    query, key = _tokens("clustered", seed=3)
    core = KMIPCore(HEADS, DIM, k=K, backend="ivf", recall=0.9)
    assert core.last_recall is None
    core(query, key, torch.randn(N, HEADS, 4))
    assert 0.9 <= core.last_recall <= 1.0
