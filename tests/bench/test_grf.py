"""GRF benchmark helpers: the grid graph and the scaling summary (no timing asserted)."""

from __future__ import annotations

import json

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
        return {"method": method, "n": n, "status": "ok", "time_min": seconds, "peak_memory_bytes": peak}

    records = [
        record("grf", 16, 1.0, 100),
        record("grf", 64, 3.0, 500),
        record("linear", 64, 0.5, 50),
        {"method": "dense", "n": 64, "status": "skipped", "reason": "killed by signal 9"},
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


def test_benchmark_runs_its_points_in_fresh_processes(tmp_path, capsys):
    from kmipgt.cli import main

    # Two methods keep the test short (one interpreter start each); the dense one only up to dense_max.
    argv = ["bench", "grf", "--n-min", "64", "--n-max", "128", "--dense-max", "64", "--repeats", "1",
            "--max-len", "3", "--methods", "grf_layer,dense", "--out", str(tmp_path)]
    assert main(argv) == 0
    result = json.loads((tmp_path / "grf.json").read_text())
    # Points in METHODS order per N, whatever the order of --methods.
    assert [(r["method"], r["n"]) for r in result["records"]] == [("dense", 64), ("grf_layer", 64),
                                                                  ("grf_layer", 128)]
    for record in result["records"]:
        assert record["status"] == "ok", record
        assert record["time_min"] > 0 and record["grid"][0] == 8 and record["page_faults_per_call"] >= 0
    assert (tmp_path / "grf.png").is_file()
    assert capsys.readouterr().out.count("page faults per call") == 3
