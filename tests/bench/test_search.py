import json

import pytest
import torch

from kmipgt.bench.search import (
    SearchBenchConfig,
    _sampled_recall,
    default_backends,
    load_tokens,
    measure_gemm,
    measure_search,
    search_markdown_table,
)
from kmipgt.cli import main
from kmipgt.ops.search.ivf_common import DEFAULT_RECALL

_PARAMS = dict(seed=0, device="cpu", dtype="float32", n=300, heads=2, dim=8, k=5, nlist=None, nprobe=None)
_PARAMS |= dict(tokens=None, recall_queries=50, repeats=2, warmup=0)


def test_sampled_recall_counts_hits_against_a_dense_top_k():
    query, key = torch.randn(40, 2, 4), torch.randn(40, 2, 4)
    exact = torch.einsum("nhd,mhd->nhm", query, key).topk(3, dim=-1).indices
    assert _sampled_recall(query, key, exact, 3, 40, 0) == 1.0
    wrong = exact.clone()
    wrong[..., 0] = torch.einsum("nhd,mhd->nhm", query, key).argmin(-1)
    assert _sampled_recall(query, key, wrong, 3, 40, 0) == pytest.approx(2 / 3)


@pytest.mark.parametrize("backend", ["fused", "ivf"])
def test_measure_search_reports_time_and_recall(backend):
    result = measure_search({**_PARAMS, "backend": backend})
    assert len(result["times"]) == 2 and result["time_min"] <= result["time_max"]
    # 300 nodes are below the IVF threshold, so both searches are exact here.
    assert result["recall"] == 1.0 and (result["heads"], result["dim"]) == (2, 8)


@pytest.mark.parametrize(("recall", "target"), [(0.9, 0.9), (None, DEFAULT_RECALL)])
def test_calibrated_ivf_point_on_clustered_tokens_reports_its_choice(recall, target):
    params = {**_PARAMS, "backend": "ivf", "n": 2048, "clusters": 8, "recall": recall, "recall_queries": 2048}
    result = measure_search(params)
    assert len(result["nprobe_chosen"]) == 2 and min(result["recall_calibrated"]) >= target
    # recall_queries = N: the benchmark's recall is over every query, against exact top-k.
    assert result["recall"] >= target
    # The table shows the nprobe chosen beside the recall (one value, or the range over the heads).
    record = {**params, **result, "status": "ok", "peak_memory_bytes": 0}
    table = search_markdown_table({"points": [record]})
    low, high = min(result["nprobe_chosen"]), max(result["nprobe_chosen"])
    assert f"recall {result['recall']:.3f} (nprobe {low}{'' if low == high else f'–{high}'})" in table


def test_a_fixed_nprobe_point_reports_no_calibration():
    params = {**_PARAMS, "backend": "ivf", "n": 2048, "clusters": 8, "nprobe": 3, "recall_queries": 64}
    result = measure_search(params)
    assert "nprobe_chosen" not in result and 0 < result["recall"] <= 1


def test_gemm_floor_has_the_search_multiply_adds():
    result = measure_gemm({**_PARAMS, "backend": "gemm"})
    assert result["gemm_size"] == round((2 * 300**2 * 8) ** (1 / 3))
    assert result["gflops"] > 0


def test_tokens_are_subsampled_in_order(tmp_path):
    path = tmp_path / "tokens.pt"
    query = torch.arange(20.0).view(10, 1, 2)
    torch.save({"query": query, "key": -query, "epoch": 3}, path)
    sub_query, sub_key = load_tokens(str(path), 4, seed=0)
    rows = sub_query[:, 0, 0] / 2
    assert sub_query.shape == (4, 1, 2) and torch.equal(sub_key, -sub_query)
    assert torch.equal(rows, rows.sort().values) and len(set(rows.tolist())) == 4
    with pytest.raises(ValueError, match="fewer than N"):
        load_tokens(str(path), 11, seed=0)
    torch.save({"q": query}, path)
    with pytest.raises(ValueError, match="'query' and 'key'"):
        load_tokens(str(path), 4, seed=0)


def test_the_default_backends_are_those_that_run_on_the_device():
    assert SearchBenchConfig(n_values=[64]).backends == default_backends("cpu")
    assert SearchBenchConfig(n_values=[64], device="cuda").backends == default_backends("cuda")


def test_config_rejects_unknown_backend_and_missing_tokens(tmp_path):
    with pytest.raises(ValueError, match="`backends` must be among"):
        SearchBenchConfig(n_values=[64], backends=["magic"])
    with pytest.raises(ValueError, match="`tokens` must be a file"):
        SearchBenchConfig(n_values=[64], tokens=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="`recall` must be in"):
        SearchBenchConfig(n_values=[64], recall=1.5)


def test_cli_bench_search_on_tokens_writes_json_png_and_table(tmp_path, capsys):
    path = tmp_path / "tokens.pt"
    torch.save({"query": torch.randn(200, 3, 4), "key": torch.randn(200, 3, 4)}, path)
    out = tmp_path / "out"
    argv = ["bench", "search", "--n", "128", "--backends", "fused", "--tokens", str(path), "--no-gemm"]
    assert main([*argv, "--repeats", "1", "--warmup", "0", "--out", str(out)]) == 0
    points = json.loads((out / "search.json").read_text())["points"]
    assert [(p["backend"], p["status"]) for p in points] == [("fused", "ok")]
    assert points[0]["heads"] == 3 and points[0]["recall"] == 1.0
    assert (out / "search.png").stat().st_size > 0
    assert "recall 1.000" in capsys.readouterr().out
