"""Approximate search with probing calibrated to a recall target (the default), checked against exact top-k
on all queries."""

from __future__ import annotations

import itertools

import pytest
import torch

from kmipgt.nn import KMIPCore
from kmipgt.ops import ProbeCalibration, topk_inner_product
from kmipgt.ops.search.ivf_common import DEFAULT_RECALL, calibrated_nprobe, default_nlist

N, HEADS, DIM, K = 4096, 2, 16, 8
APPROXIMATE = ["ivf", pytest.param("faiss", marks=pytest.mark.requires("faiss"))]


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


@pytest.mark.parametrize("backend", APPROXIMATE)
@pytest.mark.parametrize("kind", ["clustered", "gaussian"])
@pytest.mark.parametrize("target", [0.8, 0.95])
def test_calibrated_search_reaches_its_target_on_all_queries(backend, kind, target):
    query, key = _tokens(kind)
    _, exact = topk_inner_product(query, key, K, backend="dense")
    calibration = ProbeCalibration()
    _, index = topk_inner_product(query, key, K, backend=backend, recall=target, calibration=calibration)
    assert _recall(index, exact) >= target
    assert len(calibration.nprobe) == HEADS and len(calibration.recall) == HEADS
    assert min(calibration.recall) >= target
    # Not the exhaustive search in disguise: fewer lists than the index has.
    assert max(calibration.nprobe) < default_nlist(N)


@pytest.mark.parametrize("backend", APPROXIMATE)
def test_the_default_is_the_recall_target_and_reports_what_it_reached(backend):
    query, key = _tokens("clustered", seed=4)
    _, exact = topk_inner_product(query, key, K, backend="dense")
    calibration = ProbeCalibration()
    _, index = topk_inner_product(query, key, K, backend=backend, calibration=calibration)
    reached = _recall(index, exact)
    assert reached >= DEFAULT_RECALL and min(calibration.recall) >= DEFAULT_RECALL
    assert max(calibration.nprobe) < default_nlist(N)
    # The reported recall is measured on a sample of the queries: close to that over all of them.
    assert calibration.mean_recall == pytest.approx(reached, abs=0.03)
    # The calibrated search is the fixed-nprobe search at the nprobe it chose.
    for head, chosen in enumerate(calibration.nprobe):
        fixed = ProbeCalibration()
        _, one = topk_inner_product(query[:, head : head + 1], key[:, head : head + 1], K, backend=backend,
                                    nprobe=chosen, calibration=fixed)
        assert torch.equal(one[:, 0], index[:, head]) and fixed.nprobe == []


@pytest.mark.parametrize("backend", APPROXIMATE)
def test_recall_one_is_the_exact_search(backend):
    query, key = _tokens("gaussian", seed=5)
    exact_scores, exact = topk_inner_product(query, key, K, backend="dense")
    calibration = ProbeCalibration()
    scores, index = topk_inner_product(query, key, K, backend=backend, recall=1.0, calibration=calibration)
    assert torch.equal(index, exact)
    torch.testing.assert_close(scores, exact_scores)
    assert calibration.mean_recall is None  # no index was built, so nothing was calibrated


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


def test_the_margin_is_two_standard_errors_over_queries():
    # Every sampled query finds one of its two keys in its first list and both in two lists.
    even = torch.tensor([[0, 1]] * 8)
    assert calibrated_nprobe(even, 0.5) == (1, 0.5)
    assert calibrated_nprobe(even, 0.6) == (2, 1.0)
    # The same sampled recall at one list, but half the queries find both keys there and half neither:
    # the mean over queries has a standard error of 0.19, so one list no longer passes for 0.5.
    split = torch.tensor([[0, 0]] * 4 + [[1, 1]] * 4)
    assert calibrated_nprobe(split, 0.5) == (2, 1.0)
    assert calibrated_nprobe(split, 0.1) == (1, 0.5)


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


def test_recall_needs_an_approximate_backend_and_no_nprobe():
    query, key = _tokens("gaussian")
    with pytest.raises(ValueError, match=r"applies to backends \('ivf', 'faiss'\) only"):
        topk_inner_product(query, key, K, backend="torch", recall=0.9)
    with pytest.raises(ValueError, match="not both"):
        topk_inner_product(query, key, K, backend="ivf", recall=0.9, nprobe=4)


@pytest.mark.parametrize(("options", "floor"), [({"recall": 0.9}, 0.9), ({}, DEFAULT_RECALL)])
def test_core_keeps_the_recall_it_reached(options, floor):
    query, key = _tokens("clustered", seed=3)
    core = KMIPCore(HEADS, DIM, k=K, backend="ivf", **options)
    assert core.last_recall is None
    core(query, key, torch.randn(N, HEADS, 4))
    assert floor <= core.last_recall <= 1.0


def test_core_with_a_fixed_nprobe_reports_no_recall():
    query, key = _tokens("clustered", seed=3)
    core = KMIPCore(HEADS, DIM, k=K, backend="ivf", nprobe=4)
    core(query, key, torch.randn(N, HEADS, 4))
    assert core.last_recall is None
