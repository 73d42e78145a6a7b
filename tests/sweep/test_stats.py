"""Sweep statistics: group summaries and paired differences against a direct computation."""

import itertools

import numpy as np
import pytest

from kmipgt.sweep import load_sweep, paired_differences, summarize, summary_markdown
from sweep_files import TINY_CITY, write_yaml


def test_paired_differences_equal_a_direct_computation_per_seed():
    rng = np.random.default_rng(0)
    rows = []
    for variant, graph, seed in itertools.product(("kmip", "none", "gcn"), ("a", "b"), ("0", "1", "2", "3")):
        val, test = rng.random(2)
        failed = (variant, graph, seed) in {("none", "a", "2"), ("kmip", "b", "0")}
        rows.append({"variant": variant, "data.name": graph, "seed": seed,
                     "status": "failed" if failed else "ok",
                     "val": "" if failed else str(val), "test": "" if failed else str(test)})
    paired = paired_differences(rows, ["variant", "data.name", "seed"])
    assert [(p["variant"], p["data.name"], p["n"]) for p in paired] == [
        ("none", "a", 3), ("gcn", "a", 4), ("none", "b", 3), ("gcn", "b", 3)]
    ok = {(r["variant"], r["data.name"], r["seed"]): r for r in rows if r["status"] == "ok"}
    for entry in paired:
        seeds = [s for s in "0123" if (entry["variant"], entry["data.name"], s) in ok
                 and ("kmip", entry["data.name"], s) in ok]
        for name in ("val", "test"):
            diffs = np.array([float(ok[(entry["variant"], entry["data.name"], s)][name])
                              - float(ok[("kmip", entry["data.name"], s)][name]) for s in seeds])
            assert entry[f"{name}_diff_mean"] == pytest.approx(diffs.mean(), rel=1e-12)
            assert entry[f"{name}_diff_std"] == pytest.approx(diffs.std(ddof=1), rel=1e-12)
        higher = sum(float(ok[(entry["variant"], entry["data.name"], s)]["test"])
                     > float(ok[("kmip", entry["data.name"], s)]["test"]) for s in seeds)
        assert entry["test_higher"] == higher and entry["against"] == "kmip"
    # No seed axis, or no variants (a grid's first key may be a dataset): nothing to pair.
    assert paired_differences(rows, ["variant", "data.name"]) == []
    assert paired_differences(rows, ["data.name", "seed"]) == []


def test_redrawn_splits_are_replicates_like_seeds(tmp_path):
    rng = np.random.default_rng(1)
    rows = [{"variant": variant, "seed": seed, "data.name": "a", "data.split_seed": split, "status": "ok",
             "val": str(rng.random()), "test": str(rng.random()), "seconds_per_epoch": "1.0",
             "peak_memory_mb": "10.0"}
            for variant, split, seed in itertools.product(("kmip", "none"), ("1", "2", "3"), ("0", "1"))]
    rows[7].update(status="failed", val="", test="")  # none, split 1, seed 1: its pair drops out
    axes = ["variant", "seed", "data.name", "data.split_seed"]
    summary = summarize(rows, axes)
    assert [(e["variant"], e["n"], e["failed"]) for e in summary] == [("kmip", 6, 0), ("none", 5, 1)]
    finished = [row for row in rows[6:] if row["status"] == "ok"]
    assert summary[1]["test_mean"] == pytest.approx(np.mean([float(r["test"]) for r in finished]))
    (paired,) = paired_differences(rows, axes)
    kept = [i for i in range(6) if i != 1]
    assert paired["n"] == 5 and paired["by"] == "seed and data.split_seed"
    for name in ("val", "test"):
        diffs = np.array([float(rows[6 + i][name]) - float(rows[i][name]) for i in kept])
        assert paired[f"{name}_diff_mean"] == pytest.approx(diffs.mean(), rel=1e-12)
        assert paired[f"{name}_diff_std"] == pytest.approx(diffs.std(ddof=1), rel=1e-12)
    assert paired["test_higher"] == int(sum(diffs > 0))
    base = write_yaml(tmp_path / "base.yaml", TINY_CITY)
    sweep = load_sweep(write_yaml(tmp_path / "s.yaml", {
        "base": str(base), "variants": {"kmip": {}, "none": {"model.attention": "none"}},
        "grid": {"seed": [0, 1], "data.name": ["a"], "data.split_seed": [1, 2, 3]}}))
    table = summary_markdown(sweep, summary, "accuracy", "kmipgt sweep s.yaml", [paired])
    assert "over `seed` and `data.split_seed`)." in table
    assert "Paired by `seed` and `data.split_seed` against variant=kmip" in table
    assert "| none | a | 5 |" in table
    # Splits alone, at one training seed (the seed a fixed override), pair just the same.
    one_seed = [row for row in rows if row["seed"] == "0"]
    (paired,) = paired_differences(one_seed, ["variant", "data.name", "data.split_seed"])
    test = np.array([float(rows[6 + i]["test"]) - float(rows[i]["test"]) for i in (0, 2, 4)])
    assert paired["n"] == 3 and paired["by"] == "data.split_seed"
    assert paired["test_diff_mean"] == pytest.approx(test.mean(), rel=1e-12)
