"""The GRF estimator check: the exact Φ = Σ f_t W^t against numpy/scipy matrix powers, and the errors of the
walks' estimates against a recomputation from the same walks."""

import math

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from kmipgt.analysis.grf_estimator import estimation_errors, exact_modulated_walks, summarize_errors
from kmipgt.grf import grf_features, sample_walks

# A directed graph with a duplicate edge (0 -> 1 twice), a dead end (node 5 has no out-edge) and a node no
# edge enters (node 4).
DIRECTED = torch.tensor([[0, 0, 1, 2, 2, 3, 4, 1, 0], [1, 1, 2, 0, 3, 5, 0, 3, 2]])
# An undirected 8-cycle with two chords, both directions.
_CYCLE = [(i, (i + 1) % 8) for i in range(8)] + [(0, 4), (2, 6)]
UNDIRECTED = torch.tensor([[a for a, b in _CYCLE] + [b for a, b in _CYCLE],
                           [b for a, b in _CYCLE] + [a for a, b in _CYCLE]])
F = torch.tensor([[1.0, 0.6, 0.3, 0.15], [0.5, 0.5, 0.2, 0.0]])


def _reference_phi(edge_index: torch.Tensor, num_nodes: int, f: np.ndarray) -> np.ndarray:
    """Σ_t f_t W^t with scipy's adjacency (duplicates counted once) and numpy's matrix powers."""
    rows, cols = edge_index.numpy()
    adjacency = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(num_nodes, num_nodes)).tocsr()
    adjacency.data[:] = 1.0
    out_degree = np.asarray(adjacency.sum(1)).ravel()
    in_degree = np.asarray(adjacency.sum(0)).ravel()
    inverse_sqrt = lambda d: np.divide(1.0, np.sqrt(d), out=np.zeros_like(d), where=d > 0)  # noqa: E731
    w = (sp.diags(inverse_sqrt(out_degree)) @ adjacency @ sp.diags(inverse_sqrt(in_degree))).toarray()
    return sum(coefficient * np.linalg.matrix_power(w, t) for t, coefficient in enumerate(f))


@pytest.mark.parametrize(("edge_index", "num_nodes"), [(DIRECTED, 6), (UNDIRECTED, 8)])
def test_exact_phi_equals_matrix_powers(edge_index, num_nodes):
    phi = exact_modulated_walks(edge_index, num_nodes, F)
    assert phi.shape == (2, num_nodes, num_nodes) and phi.dtype == torch.float64
    for head in range(2):
        np.testing.assert_allclose(phi[head].numpy(), _reference_phi(edge_index, num_nodes, F[head].numpy()),
                                   rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(exact_modulated_walks(edge_index, num_nodes, F[1]).numpy(), phi[1].numpy())


def test_reported_errors_are_those_of_the_same_seeds_walks():
    rows = estimation_errors(DIRECTED, 6, F, [3, 40], [0, 1], p_halt=0.3, repelling=True)
    assert [(r["num_walks"], r["seed"], r["head"]) for r in rows] == [
        (n, s, h) for n in (3, 40) for s in (0, 1) for h in (0, 1)
    ]
    for row in rows:
        walks = sample_walks(DIRECTED, 6, num_walks=row["num_walks"], p_halt=0.3, max_len=3, seed=row["seed"],
                             repelling=True, dtype=torch.float64)
        estimate = grf_features(walks, F[row["head"]].double()).to_dense().numpy()
        exact = _reference_phi(DIRECTED, 6, F[row["head"]].numpy())
        features = np.linalg.norm(estimate - exact) / np.linalg.norm(exact)
        mask = np.linalg.norm(estimate @ estimate.T - exact @ exact.T) / np.linalg.norm(exact @ exact.T)
        assert math.isclose(row["features_error"], features, rel_tol=1e-9)
        assert math.isclose(row["mask_error"], mask, rel_tol=1e-9)
        assert row["nonzeros_per_row"] == walks.nnz / 6
        assert row["mask_nonzeros_per_row"] == np.count_nonzero(estimate @ estimate.T) / 6
        assert row["exact_mask_nonzeros_per_row"] == np.count_nonzero(exact @ exact.T) / 6


def test_the_keys_a_query_reaches_are_those_within_twice_the_walk_length():
    """On a path, ΦΦᵀ links the nodes within 2T hops (networkx); the walks' mask links a subset of them,
    all of them once every node's walkers cover its T-hop neighbourhood."""
    import networkx as nx

    n, f = 20, torch.tensor([[1.0, 0.5, 0.25, 0.125], [1.0, 0.5, 0.0, 0.0]])
    path = nx.path_graph(n)
    edge_index = torch.tensor([[a for a, b in path.edges] + [b for a, b in path.edges],
                               [b for a, b in path.edges] + [a for a, b in path.edges]])
    rows = estimation_errors(edge_index, n, f, [2, 3000], [0], p_halt=0.2)
    for head, hops in ((0, 6), (1, 2)):  # f_t > 0 up to t = 3 and t = 1
        within = sum(len(nx.single_source_shortest_path_length(path, i, cutoff=hops)) for i in range(n)) / n
        few, many = (row for row in rows if row["head"] == head)
        assert few["exact_mask_nonzeros_per_row"] == many["exact_mask_nonzeros_per_row"] == within
        assert few["mask_nonzeros_per_row"] < within and many["mask_nonzeros_per_row"] == within


def test_identity_modulation_is_estimated_exactly():
    """f = δ_0: every walk contributes only its start, so Φ̂ = Φ = I at any walk count."""
    f = torch.tensor([[1.0, 0.0, 0.0]])
    for row in estimation_errors(UNDIRECTED, 8, f, [1, 7], [0, 1, 2], p_halt=0.5):
        assert row["features_error"] == 0.0 and row["mask_error"] == 0.0


def test_errors_shrink_as_the_walks_grow():
    """The estimate is unbiased with variance ∝ 1/n: 500 times the walks cut the error about 22-fold."""
    rows = estimation_errors(UNDIRECTED, 8, F, [4, 2000], [0, 1, 2], p_halt=0.2)
    summary = {entry["num_walks"]: entry for entry in summarize_errors(rows)}
    for key in ("features_error", "mask_error"):
        assert summary[2000][key] < 0.04
        assert summary[2000][key] < summary[4][key] / 8


def test_summary_averages_over_seeds_and_heads():
    rows = [{"num_walks": n, "seed": s, "head": 0, "features_error": e, "mask_error": 2 * e,
             "nonzeros_per_row": 3.0, "mask_nonzeros_per_row": 4 * e, "exact_mask_nonzeros_per_row": 5.0}
            for n, s, e in [(1, 0, 0.5), (1, 1, 0.3), (9, 0, 0.1)]]
    one, nine = summarize_errors(rows)
    assert one["num_walks"] == 1 and one["rows"] == 2
    assert math.isclose(one["features_error"], 0.4) and math.isclose(one["mask_error"], 0.8)
    assert math.isclose(one["features_error_std"], math.sqrt(0.02))
    assert nine["rows"] == 1 and math.isnan(nine["mask_error_std"]) and nine["nonzeros_per_row"] == 3.0
    assert math.isclose(one["mask_nonzeros_per_row"], 1.6) and one["exact_mask_nonzeros_per_row"] == 5.0


def test_bad_modulation_shapes_are_refused():
    with pytest.raises(ValueError, match=r"\[H, T \+ 1\]"):
        estimation_errors(UNDIRECTED, 8, F[0], [4], [0], p_halt=0.5)
    with pytest.raises(ValueError, match=r"\[T \+ 1\] or \[H, T \+ 1\]"):
        exact_modulated_walks(UNDIRECTED, 8, F[None])
