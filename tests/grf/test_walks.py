"""Walk sampler and GRF features against dense matrix powers (networkx graphs, numpy references)."""

from __future__ import annotations

import networkx as nx
import numpy as np
import pytest
import torch

from kmipgt.grf import GRFWalks, grf_features, sample_walks


def _edge_index(graph: nx.Graph, offset: int = 0) -> torch.Tensor:
    edges = np.array(graph.edges(), dtype=np.int64).reshape(-1, 2).T + offset
    return torch.from_numpy(np.concatenate([edges, edges[::-1]], axis=1))


def _sym_normalised(graph: nx.Graph) -> np.ndarray:
    adjacency = nx.to_numpy_array(graph, nodelist=range(graph.number_of_nodes()))
    deg = adjacency.sum(1)
    inv_sqrt = np.where(deg > 0, 1 / np.sqrt(np.maximum(deg, 1)), 0.0)
    return inv_sqrt[:, None] * adjacency * inv_sqrt[None, :]


SMALL = nx.lollipop_graph(4, 4)  # irregular degrees: loads are not all equal
F = np.array([1.0, 0.6, 0.3, 0.1])


def _features(seed: int, num_walks: int, **kwargs) -> np.ndarray:
    walks = sample_walks(
        _edge_index(SMALL),
        SMALL.number_of_nodes(),
        num_walks=num_walks,
        p_halt=0.4,
        max_len=3,
        seed=seed,
        dtype=torch.float64,
        **kwargs,
    )
    return grf_features(walks, torch.tensor(F)).to_dense().numpy()


@pytest.mark.parametrize("scheme", [{}, {"antithetic": True}, {"repelling": True}])
def test_step_matrices_are_unbiased_for_matrix_powers(scheme):
    """E[P_t] = W^t; many walkers per node average the same way as many seeds."""
    w = _sym_normalised(SMALL)
    walks = sample_walks(
        _edge_index(SMALL), 8, num_walks=20000, p_halt=0.4, max_len=3, seed=0, dtype=torch.float64, **scheme
    )
    for t in range(4):
        expected = np.linalg.matrix_power(w, t)
        error = np.linalg.norm(walks.step_matrix(t).to_dense().numpy() - expected) / np.linalg.norm(expected)
        assert error < 0.06, (t, error)


def test_mask_estimate_is_unbiased_and_error_shrinks_with_walkers():
    """Independent walk sets on the two sides: E[Φ̂_a Φ̂_bᵀ] = Σ α_k W^k with α = f * f."""
    w = _sym_normalised(SMALL)
    alpha = np.convolve(F, F)
    target = sum(a * np.linalg.matrix_power(w, k) for k, a in enumerate(alpha))
    errors = {}
    for num_walks in (4, 256):
        estimate = np.mean(
            [_features(2 * s, num_walks) @ _features(2 * s + 1, num_walks).T for s in range(20)], axis=0
        )
        errors[num_walks] = np.linalg.norm(estimate - target) / np.linalg.norm(target)
    assert errors[256] < 0.03
    assert errors[256] < errors[4] / 3


def test_loads_on_a_cycle_are_powers_of_the_continuation_factor():
    """On a cycle W·deg = 1, so a walker's load after t moves is exactly (1 / (1 - p))^t."""
    cycle = nx.cycle_graph(7)
    p_halt, num_walks = 0.3, 5
    walks = sample_walks(
        _edge_index(cycle), 7, num_walks=num_walks, p_halt=p_halt, max_len=6, seed=3, dtype=torch.float64
    )
    walker_counts = walks.load.numpy() * num_walks * (1 - p_halt) ** walks.step.numpy()
    np.testing.assert_allclose(walker_counts, np.round(walker_counts), atol=1e-9)
    assert np.round(walker_counts).min() >= 1
    assert int(walks.step.max()) <= 6


def test_walks_stop_at_dead_ends_and_max_len():
    # 0 -> 1 only: node 1 has no neighbours, node 2 is isolated.
    walks = sample_walks(torch.tensor([[0], [1]]), 3, num_walks=50, p_halt=0.1, max_len=5, seed=0)
    assert set(walks.step[walks.start == 0].tolist()) == {0, 1}
    assert walks.step[walks.start == 1].tolist() == [0]
    assert walks.step[walks.start == 2].tolist() == [0]
    # The edge into the dead end has weight 1/sqrt(out-degree 1 * in-degree 1): a finite load of
    # (walkers that moved) / num_walks / (1 - p_halt).
    moved = (walks.start == 0) & (walks.step == 1)
    walker_counts = walks.load[moved].double().numpy() * 50 * (1 - 0.1)
    np.testing.assert_allclose(walker_counts, np.round(walker_counts), atol=1e-4)
    assert np.round(walker_counts).min() >= 1
    grid = nx.grid_2d_graph(5, 5)
    grid = nx.convert_node_labels_to_integers(grid)
    walks = sample_walks(_edge_index(grid), 25, num_walks=20, p_halt=0.05, max_len=2, seed=0)
    assert int(walks.step.max()) == 2


def test_step_zero_is_identity_and_features_match_step_sum():
    walks = sample_walks(_edge_index(SMALL), 8, num_walks=3, p_halt=0.5, max_len=3, seed=1)
    np.testing.assert_allclose(walks.step_matrix(0).to_dense().numpy(), np.eye(8))
    f = torch.tensor([[0.5, 0.2, 0.1, 0.05], [1.0, 0.0, 2.0, 0.0]])
    per_head = grf_features(walks, f).to_dense()
    for h in range(2):
        expected = sum(f[h, t] * walks.step_matrix(t).to_dense() for t in range(4))
        torch.testing.assert_close(per_head[h], expected)


def test_walks_never_leave_their_graph():
    graphs = [nx.path_graph(5), nx.cycle_graph(6), nx.complete_graph(4)]
    sizes = [g.number_of_nodes() for g in graphs]
    ptr = torch.tensor([0, *np.cumsum(sizes)])
    edge_index = torch.cat([_edge_index(g, int(o)) for g, o in zip(graphs, ptr[:-1], strict=True)], dim=1)
    walks = sample_walks(edge_index, int(ptr[-1]), num_walks=8, p_halt=0.1, max_len=8, seed=0, ptr=ptr)
    graph_of = torch.repeat_interleave(torch.arange(3), torch.tensor(sizes))
    start, node = walks.pairs
    assert torch.equal(graph_of[start], graph_of[node])
    crossing = torch.tensor([[0], [7]])
    with pytest.raises(ValueError, match="different graphs"):
        sample_walks(
            torch.cat([edge_index, crossing], 1), int(ptr[-1]), num_walks=2, p_halt=0.5, max_len=2, ptr=ptr
        )


def test_nnz_grows_linearly_with_grid_size():
    nnz = []
    for side in (16, 32, 64):
        grid = nx.convert_node_labels_to_integers(nx.grid_2d_graph(side, side))
        walks = sample_walks(_edge_index(grid), side * side, num_walks=4, p_halt=0.5, max_len=10, seed=0)
        nnz.append(walks.nnz)
    ratios = np.array(nnz[1:]) / np.array(nnz[:-1])
    assert np.all((ratios > 3.6) & (ratios < 4.4)), ratios


def test_same_seed_same_walks_and_gradients_reach_f():
    args = (_edge_index(SMALL), 8)
    first = sample_walks(*args, num_walks=4, p_halt=0.3, max_len=3, seed=7)
    second = sample_walks(*args, num_walks=4, p_halt=0.3, max_len=3, seed=7)
    assert torch.equal(first.pairs, second.pairs) and torch.equal(first.load, second.load)
    theta = torch.zeros(2, 4, requires_grad=True)
    features = grf_features(first, torch.nn.functional.softplus(theta))
    (features.to_dense() ** 2).sum().backward()
    assert theta.grad is not None and bool((theta.grad.abs() > 0).all())


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"num_walks": 0}, ValueError),
        ({"p_halt": 1.0}, ValueError),
        ({"max_len": -1}, ValueError),
        ({"num_walks": 3, "antithetic": True}, ValueError),
    ],
)
def test_bad_arguments_are_rejected(kwargs, error):
    base = {"num_walks": 2, "p_halt": 0.5, "max_len": 2}
    with pytest.raises(error):
        sample_walks(_edge_index(SMALL), 8, **{**base, **kwargs})


def test_bad_inputs_are_rejected():
    with pytest.raises(ValueError, match="edge_index"):
        sample_walks(torch.tensor([[0, 9]]), 8, num_walks=2, p_halt=0.5, max_len=2)
    with pytest.raises(TypeError, match="edge_index"):
        sample_walks(torch.zeros(2, 3), 8, num_walks=2, p_halt=0.5, max_len=2)
    walks = sample_walks(_edge_index(SMALL), 8, num_walks=2, p_halt=0.5, max_len=2)
    assert isinstance(walks, GRFWalks)
    with pytest.raises(ValueError, match="max_len"):
        grf_features(walks, torch.ones(5))


def _feature_variance(p_halt: float, seeds: int, **scheme) -> float:
    grid = nx.convert_node_labels_to_integers(nx.grid_2d_graph(5, 5))
    f = torch.tensor([1.0, 0.8, 0.6, 0.4, 0.2], dtype=torch.float64)
    samples = [
        grf_features(
            sample_walks(
                _edge_index(grid),
                25,
                num_walks=4,
                p_halt=p_halt,
                max_len=4,
                seed=s,
                dtype=torch.float64,
                **scheme,
            ),
            f,
        )
        .to_dense()
        .numpy()
        for s in range(seeds)
    ]
    return float(np.stack(samples).var(axis=0).sum())


def test_repelling_and_antithetic_walks_reduce_variance():
    assert _feature_variance(0.3, 100, repelling=True) < 0.85 * _feature_variance(0.3, 100)
    assert _feature_variance(0.5, 100, antithetic=True) < 0.97 * _feature_variance(0.5, 100)
