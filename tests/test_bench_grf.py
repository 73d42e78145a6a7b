"""GRF benchmark helpers: the grid graph and the scaling summary (no timing asserted)."""

from __future__ import annotations

import networkx as nx
import pytest

from kmipgt.bench.grf import GRFBenchConfig, grid_edge_index, scaling_summary


def test_grid_matches_networkx_lattice():
    height, width = 3, 5
    edge_index = grid_edge_index(height, width)
    ours = {tuple(e) for e in edge_index.T.tolist()}
    lattice = nx.grid_2d_graph(height, width)
    expected = set()
    for (r1, c1), (r2, c2) in lattice.edges():
        a, b = r1 * width + c1, r2 * width + c2
        expected |= {(a, b), (b, a)}
    assert ours == expected
    assert edge_index.shape[1] == len(expected)


def test_scaling_summary_ratios():
    def record(method, n, seconds, peak):
        return {"method": method, "num_nodes": n, "seconds_min": seconds, "peak_bytes": peak}

    records = [
        record("grf", 16, 1.0, 100),
        record("grf", 64, 3.0, 500),
        record("linear", 64, 0.5, 50),
        {"method": "dense", "num_nodes": 64, "error": "worker exit code -9"},
    ]
    summary = scaling_summary(records, 16, 64)
    assert summary["x4_steps"]["grf"] == [{"from": 16, "to": 64, "time": 3.0, "memory": 5.0}]
    assert summary["at_high"]["grf/linear"] == {"time": 6.0, "memory": 10.0}
    assert "dense" not in summary["x4_steps"]


def test_config_sizes_are_powers_of_two_and_validated():
    assert GRFBenchConfig(n_min=1024, n_max=8192).sizes() == [1024, 2048, 4096, 8192]
    with pytest.raises(ValueError, match="n_min"):
        GRFBenchConfig(n_min=4096, n_max=1024).sizes()
    with pytest.raises(ValueError, match="power of two"):
        GRFBenchConfig(n_min=1000, n_max=4000).sizes()
