import json

import pytest

from kmipgt.bench import common
from kmipgt.bench.attention import AttentionBenchConfig

GIB = 2**30


def test_geometric_grid_is_the_analytic_list():
    assert common.geometric_grid(1024, 262_144) == [1024 * 2**i for i in range(9)]
    assert common.geometric_grid(4096, 1_048_576, factor=4.0) == [4096, 16_384, 65_536, 262_144, 1_048_576]
    # 10·1.5^i = 10, 15, 22.5, 33.75 (50.6 > 40), rounded half to even.
    assert common.geometric_grid(10, 40, factor=1.5) == [10, 15, 22, 34]
    assert common.geometric_grid(3, 3) == [3]
    with pytest.raises(ValueError, match="n_min"):
        common.geometric_grid(10, 5)
    with pytest.raises(ValueError, match="factor"):
        common.geometric_grid(1, 8, factor=1.0)


def test_budget_prediction_matches_a_hand_computation():
    config = common.PointBenchConfig(
        n_values=[1000], repeats=2, warmup=1, time_budget=100.0, memory_budget_gb=1
    )
    previous = {"status": "ok", "n": 1000, "time_median": 1.0, "peak_memory_bytes": GIB // 4}
    # N ×4: 1 s · 4² · 3 runs = 48 s <= 100 s; 0.25 GiB · 4 = 1 GiB, not over 1 GiB.
    assert common.predicted_over_budget(previous, 4000, config) is None
    # N ×8: 1 s · 8² · 3 runs = 192 s > 100 s.
    assert common.predicted_over_budget(previous, 8000, config) == "predicted time over the 100 s budget"
    # N ×8 at N^1.5: 8^1.5 · 3 ≈ 67.9 s fits, but 0.25 GiB · 8 = 2 GiB does not.
    reason = common.predicted_over_budget(previous, 8000, config, time_exponent=1.5)
    assert reason == "predicted memory over the 1 GB budget"
    # N ×4 with memory quadratic in N: 0.25 GiB · 16 = 4 GiB.
    assert "memory" in common.predicted_over_budget(previous, 4000, config, memory_exponent=2.0)
    assert common.predicted_over_budget(None, 10**9, config) is None
    skipped = {"status": "skipped", "n": 1000}
    assert common.predicted_over_budget(skipped, 2000, config) == (
        "a smaller N of this series was already over budget"
    )


def test_naive_attention_first_point_budget_is_its_score_matrices():
    # 3 float32 score tensors · B=2 · H=2 · 4096² = 768 MiB: over 0.5 GB, within 1 GB.
    params = {"method": "full-naive", "n": 4096}
    tight = AttentionBenchConfig(n_values=[4096], graphs=2, heads=2, memory_budget_gb=0.5)
    assert "materialised score matrix" in tight.over_budget(None, params)
    roomy = AttentionBenchConfig(n_values=[4096], graphs=2, heads=2, memory_budget_gb=1.0)
    assert roomy.over_budget(None, params) is None
    assert tight.over_budget(None, {"method": "full", "n": 4096}) is None


def test_config_sorts_sizes_and_rejects_bad_run_options():
    assert common.PointBenchConfig(n_values=[64, 8, 16]).n_values == [8, 16, 64]
    with pytest.raises(ValueError, match="n_values"):
        common.PointBenchConfig(n_values=[])
    with pytest.raises(ValueError, match="repeats"):
        common.PointBenchConfig(n_values=[8], repeats=0)
    with pytest.raises(ValueError, match="memory_budget_gb"):
        common.PointBenchConfig(n_values=[8], memory_budget_gb=0)


def test_points_over_budget_are_recorded_without_a_process(monkeypatch):
    def no_process(*args):
        raise AssertionError("a skipped point must not start a process")

    monkeypatch.setattr(common, "run_isolated", no_process)
    seen = []

    def over_budget(previous, params):
        seen.append((previous and previous["n"], params["method"], params["n"], params["seed"]))
        return "too big"

    todo = [({"method": m}, n) for m in ("a", "b") for n in (8, 16)]
    records = common.run_points(todo, {"seed": 3}, "x:y", 1.0, desc="test", over_budget=over_budget)
    assert records == [{**spec, "n": n, "status": "skipped", "reason": "too big"} for spec, n in todo]
    # Each point sees the previous point of its own spec.
    assert seen == [(None, "a", 8, 3), (8, "a", 16, 3), (None, "b", 8, 3), (8, "b", 16, 3)]


def test_result_json_round_trips_and_the_plot_is_written(tmp_path):
    config = common.PointBenchConfig(n_values=[8, 16])
    records = [
        {"method": "a", "n": n, "status": "ok", "time_median": n / 1000, "peak_memory_bytes": n * 2**20}
        for n in (8, 16)
    ]
    result = common.bench_result(config, "cpu", points=records)
    assert list(result) == ["config", "machine", "points"]
    stem = tmp_path / "out" / "demo"
    panels = [common.TIME_PANEL, common.MEMORY_PANEL]
    common.write_result(stem, result, records, lambda r: r["method"], panels, "demo")
    assert json.loads((tmp_path / "out" / "demo.json").read_text()) == result
    assert (tmp_path / "out" / "demo.png").stat().st_size > 0


def test_series_table_has_a_row_per_n_and_blank_missing_cells():
    points = [{"s": "a", "n": 1000}, {"s": "b", "n": 8}, {"s": "a", "n": 8}]
    table = common.series_table(points, ["a", "b"], lambda r: r["s"], lambda r: f"{r['s']}@{r['n']}")
    assert table == "| N | a | b |\n|---|---|---|\n| 8 | a@8 | b@8 |\n| 1,000 | a@1000 |  |"
