import json

import pytest
import torch

from kmipgt.bench.attention import (
    AttentionBenchConfig,
    markdown_table,
    measure_point,
    naive_attention,
    run_attention_benchmark,
)
from kmipgt.cli import main


def test_naive_attention_matches_sdpa():
    q, k, v = (torch.randn(30, 2, 4, dtype=torch.float64) for _ in range(3))
    ptr = torch.tensor([0, 10, 30])
    out = naive_attention(q, k, v, ptr, 0.5)
    ref = torch.cat(
        [
            torch.nn.functional.scaled_dot_product_attention(
                *(t[a:b].transpose(0, 1) for t in (q, k, v)), scale=0.5
            ).transpose(0, 1)
            for a, b in ((0, 10), (10, 30))
        ]
    )
    torch.testing.assert_close(out, ref)


def test_measure_point_reports_timing_statistics():
    params = dict(seed=0, device="cpu", dtype="float32", n=64, graphs=2, heads=2, dim=8, dim_v=8, k=4)
    params |= dict(backend="torch", repeats=3, warmup=1, method="kmip", **{"pass": "forward+backward"})
    result = measure_point(params)
    assert len(result["times"]) == 3
    assert result["time_min"] <= result["time_median"] <= result["time_max"]


def test_benchmark_writes_every_point(tmp_path):
    config = AttentionBenchConfig(
        n_values=[64], methods=["kmip", "full-naive"], passes=["forward"], repeats=1
    )
    result = run_attention_benchmark(config, tmp_path)
    points = json.loads((tmp_path / "attention.json").read_text())["points"]
    assert {p["method"] for p in points} == {"kmip", "full-naive"}
    assert all(p["status"] == "ok" and p["peak_memory_bytes"] >= 0 for p in points)
    assert (tmp_path / "attention.png").stat().st_size > 0
    assert "kmip[auto] forward" in markdown_table(result)  # the library's default search, as the CLI's


def test_point_over_memory_budget_is_recorded_not_run(tmp_path):
    config = AttentionBenchConfig(
        n_values=[4096], methods=["full-naive"], passes=["forward"], memory_budget_gb=0.1
    )
    (point,) = run_attention_benchmark(config, tmp_path)["points"]
    # 3 × 4 B × 4096² = 192 MiB of scores cannot fit a 0.1 GB budget.
    assert point["status"] == "skipped" and "memory" in point["reason"]


def test_config_rejects_unknown_method():
    with pytest.raises(ValueError, match="methods"):
        AttentionBenchConfig(n_values=[8], methods=["flash"])


def test_cli_runs_a_tiny_benchmark(tmp_path, capsys):
    args = [
        "bench",
        "attention",
        "--n",
        "32",
        "--methods",
        "kmip",
        "--passes",
        "forward",
        "--repeats",
        "1",
        "--out",
    ]
    code = main([*args, str(tmp_path)])
    assert code == 0
    assert "kmip[auto] forward" in capsys.readouterr().out
