"""`kmipgt sweep`: grid expansion, per-cell processes, resume, failures kept per cell, summaries."""

import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from kmipgt.cli import main
from kmipgt.train import build_model
from kmipgt.train.config import config_to_dict, load_config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.sweep import (
    cell_dir,
    cell_overrides,
    expand,
    format_value,
    load_sweep,
    numeric_axis,
    paired_differences,
    plot_summary,
    run_sweep,
    summarize,
    summary_markdown,
)

REPO = Path(__file__).parents[2]
TINY_CITY = {
    "data": {"name": "synthetic_city",
             "options": {"num_nodes": 120, "hops": 3, "num_workers": 1, "progress": False}},
    "model": {"channels": 8, "num_layers": 1, "k": 4, "heads": 2},
    "optim": {"epochs": 2, "warmup_epochs": 1},
    "device": "cpu",
    "threads": 1,
}


def _write(path, content):
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


VALUES = ["kmip", 1e-5, 0.001, 3, None, True, [0, 1], {"root": "/d", "n": [2]}, "a: b"]


@pytest.mark.parametrize("value", VALUES)
def test_format_value_reads_back_as_the_same_value(value):
    assert yaml.safe_load(format_value(value)) == value


def test_grid_expands_in_file_order_with_readable_names(tmp_path):
    base = _write(tmp_path / "base.yaml", TINY_CITY)
    path = _write(tmp_path / "grid.yaml", {
        "base": str(base),
        "set": {"optim.epochs": 7},
        "grid": {"model.attention": ["kmip", "none"], "model.coord_columns": [[0, 1]], "seed": [0, 1, 2]},
    })
    sweep = load_sweep(path)
    assert sweep.out.as_posix() == "runs/sweeps/grid"
    cells = expand(sweep)
    assert len(cells) == 2 * 1 * 3
    assert [(c.values["model.attention"], c.values["seed"]) for c in cells] == [
        ("kmip", 0), ("kmip", 1), ("kmip", 2), ("none", 0), ("none", 1), ("none", 2)]
    assert cells[4].name == "model.attention=none__model.coord_columns=0_1__seed=1"
    assert cells[4].label == "model.attention=none model.coord_columns=[0, 1] seed=1"
    config = load_config(base, cell_overrides(sweep, cells[4]))
    assert (config.model.attention, config.model.coord_columns, config.seed) == ("none", [0, 1], 1)
    assert config.optim.epochs == 7 and config.out_dir == "runs/sweeps/grid/cells/" + cells[4].name
    assert load_sweep(path, out=tmp_path / "elsewhere").out == tmp_path / "elsewhere"


def test_variants_are_a_first_axis_of_keys_set_together(tmp_path):
    base = _write(tmp_path / "base.yaml", TINY_CITY)
    path = _write(tmp_path / "variants.yaml", {
        "base": str(base),
        "set": {"optim.epochs": 7},
        "variants": {"kmip": {}, "wide": {"model.attention": "none", "model.channels": 12}},
        "grid": {"seed": [0, 1]},
    })
    sweep = load_sweep(path)
    cells = expand(sweep)
    assert [c.name for c in cells] == [
        "variant=kmip__seed=0", "variant=kmip__seed=1", "variant=wide__seed=0", "variant=wide__seed=1"]
    configs = [load_config(base, cell_overrides(sweep, cell)) for cell in cells]
    assert [(c.model.attention, c.model.channels, c.seed) for c in configs] == [
        ("kmip", 8, 0), ("kmip", 8, 1), ("none", 12, 0), ("none", 12, 1)]
    assert all(c.optim.epochs == 7 for c in configs)
    rows = [{"variant": c.values["variant"], "seed": str(c.values["seed"]), "status": "ok", "val": 0.5,
             "test": 0.1 * i, "seconds_per_epoch": 1.0, "peak_memory_mb": 10.0} for i, c in enumerate(cells)]
    summary = summarize(rows, list(sweep.axes()))
    assert [(e["variant"], e["n"]) for e in summary] == [("kmip", 2), ("wide", 2)]
    assert summary[1]["test_mean"] == pytest.approx(0.25)
    table = summary_markdown(sweep, summary, "accuracy", "kmipgt sweep variants.yaml")
    assert '`wide`: `{"model.attention": "none", "model.channels": 12}`' in table
    assert "| variant | n | val accuracy |" in table and "| wide | 2 |" in table
    paired = paired_differences(rows, list(sweep.axes()))  # test: kmip 0.0, 0.1; wide 0.2, 0.3
    assert "Paired by" not in table
    table = summary_markdown(sweep, summary, "accuracy", "kmipgt sweep variants.yaml", paired)
    assert "over `seed`)." in table and "Paired by `seed` against variant=kmip" in table
    assert "| wide | 2 | +0.0000 ± 0.0000 | +0.2000 ± 0.0000 | 2 of 2 |" in table


def test_command_line_overrides_join_the_files_set(tmp_path):
    base = _write(tmp_path / "base.yaml", TINY_CITY)
    path = _write(tmp_path / "s.yaml", {
        "base": str(base), "set": {"optim.epochs": 7, "optim.lr": 0.01}, "grid": {"seed": [0]}})
    sweep = load_sweep(path, overrides=["optim.epochs=3", "model.coord_columns=[0, 1]"])
    assert sweep.fixed == {"optim.epochs": 3, "optim.lr": 0.01, "model.coord_columns": [0, 1]}
    config = load_config(base, cell_overrides(sweep, expand(sweep)[0]))
    assert (config.optim.epochs, config.optim.lr, config.model.coord_columns) == (3, 0.01, [0, 1])
    with pytest.raises(ValueError, match="both fixed"):
        load_sweep(path, overrides=["seed=4"])
    with pytest.raises(ValueError, match=r"key\.sub=value"):
        load_sweep(path, overrides=["optim.epochs"])
    with pytest.raises(ValueError, match="--set must not set out_dir"):
        load_sweep(path, overrides=["out_dir=x"])


@pytest.mark.parametrize(("content", "message"), [
    ({"base": "b.yaml", "variants": {"a": {"seed": 1}}, "grid": {"seed": [0]}}, "variant 'a' sets keys"),
    ({"base": "b.yaml", "variants": {"a": {"seed": 1}}, "set": {"seed": 0}}, "variant 'a' sets keys"),
    ({"base": "b.yaml", "variants": {"a": {}}, "grid": {"variant": [0]}}, "axis of 'variants'"),
    ({"base": "b.yaml", "variants": [{"seed": 1}]}, "non-empty mapping of names"),
    ({"base": "b.yaml", "variants": {"a": {"out_dir": "x"}}}, "must not set out_dir"),
    ({"grid": {"seed": [0]}}, "needs a base config"),
    ({"base": "b.yaml", "grid": {"seed": []}}, "non-empty list"),
    ({"base": "b.yaml", "grid": {"seed": [0]}, "runs": 3}, "unknown sweep keys"),
    ({"base": "b.yaml", "set": {"out_dir": "x"}}, "must not set out_dir"),
    ({"base": "b.yaml", "set": ["optim.epochs=3"]}, "set must be a mapping"),
    ({"base": "b.yaml", "set": {"seed": 1}, "grid": {"seed": [0]}}, "both fixed"),
])
def test_bad_sweep_files_are_errors(tmp_path, content, message):
    with pytest.raises(ValueError, match=message):
        load_sweep(_write(tmp_path / "s.yaml", content))


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # five `kmipgt train` processes, each importing torch and PyG
def test_sweep_runs_cells_keeps_failures_resumes_and_summarises(tmp_path, capsys):
    base = _write(tmp_path / "base.yaml", TINY_CITY)
    out = tmp_path / "sweep"
    # seed=-1 is refused by NumPy in the cell's process: a crash that must stay in its cell.
    path = _write(tmp_path / "s.yaml", {
        "base": str(base), "grid": {"model.attention": ["kmip"], "seed": [0, 1, -1]}, "out": str(out),
    })
    learning_rate = ["--set", "optim.lr=0.01"]  # from the command line, for every cell
    assert main(["sweep", str(path), "--jobs", "2", *learning_rate]) == 1
    printed = capsys.readouterr().out
    assert printed.count("[") >= 3 and "FAILED" in printed and "[3/3]" in printed

    rows = _read_csv(out / "results.csv")
    assert [(r["seed"], r["status"]) for r in rows] == [("0", "ok"), ("1", "ok"), ("-1", "failed")]
    assert "Seed must be between" in rows[2]["error"] and rows[2]["test"] == ""
    error_file = out / "cells" / "model.attention=kmip__seed=-1" / "error.txt"
    assert "Seed must be between" in error_file.read_text()
    for row in rows[:2]:
        cell = out / "cells" / row["cell"]
        saved = yaml.safe_load((cell / "config.yaml").read_text())
        assert saved["seed"] == int(row["seed"]) and saved["optim"]["lr"] == 0.01
        assert saved["out_dir"] == str(cell)
        metrics = json.loads((cell / "metrics.json").read_text())
        assert float(row["test"]) == metrics["test"] and int(row["parameters"]) == metrics["parameters"]

    # Statistics recomputed here from results.csv: mean and sample std (ddof=1) over the finished seeds.
    ok = [r for r in rows if r["status"] == "ok"]
    summary = _read_csv(out / "summary.csv")
    assert len(summary) == 1 and summary[0]["n"] == "2" and summary[0]["failed"] == "1"
    markdown = (out / "summary.md").read_text()
    for name in ("val", "test", "seconds_per_epoch", "peak_memory_mb"):
        values = np.array([float(r[name]) for r in ok])
        assert float(summary[0][f"{name}_mean"]) == pytest.approx(values.mean(), rel=1e-12)
        assert float(summary[0][f"{name}_std"]) == pytest.approx(values.std(ddof=1), rel=1e-12, abs=1e-15)
    test_values = np.array([float(r["test"]) for r in ok])
    assert f"{test_values.mean():.4f} ± {test_values.std(ddof=1):.4f}" in markdown
    assert "kmipgt sweep" in markdown and "--set=optim.lr=0.01" in markdown
    assert (out / "summary.png").stat().st_size > 0

    # Re-running trains only what is missing: the failed cell again, and a cell whose metrics.json is
    # gone resumes from its last.pt (no new epochs), while the finished cell is not touched.
    finished = out / "cells" / rows[0]["cell"] / "metrics.json"
    stamp = finished.stat().st_mtime_ns
    resumed = out / "cells" / rows[1]["cell"]
    (resumed / "metrics.json").unlink()
    main(["sweep", str(path), "--dry-run", *learning_rate])
    listing = capsys.readouterr().out
    assert "seed=0  [done]" in listing and "seed=1  [resume]" in listing and "seed=-1  [new]" in listing
    assert main(["sweep", str(path), "--jobs", "2", *learning_rate]) == 1
    printed = capsys.readouterr().out
    assert "seed=0: val" in printed and "(done earlier)" in printed
    assert finished.stat().st_mtime_ns == stamp
    assert len(_read_csv(resumed / "log.csv")) == 2  # the two epochs of the first run, none added
    again = _read_csv(out / "results.csv")
    assert again[1]["test"] == rows[1]["test"] and again[2]["status"] == "failed"


def test_finished_cells_are_reused_only_with_the_same_config(tmp_path):
    base = _write(tmp_path / "base.yaml", TINY_CITY)
    content = {"base": str(base), "grid": {"seed": [0, 1]}, "out": str(tmp_path / "o")}
    path = _write(tmp_path / "s.yaml", content)
    sweep = load_sweep(path)
    metrics = {"metric": "accuracy", "train": 0.9, "val": 0.7, "test": 0.6, "best_epoch": 2, "epochs": 2,
               "seconds_per_epoch": 0.1, "peak_memory_mb": 100.0, "parameters": 10, "complete": True}
    for cell, extra in zip(expand(sweep), ([], ["optim.lr=0.5"]), strict=True):  # seed=1: trained otherwise
        directory = cell_dir(sweep, cell)
        directory.mkdir(parents=True)
        config = config_to_dict(load_config(base, [*cell_overrides(sweep, cell), *extra]))
        _write(directory / "config.yaml", config)
        (directory / "metrics.json").write_text(json.dumps(metrics))
    lines = []
    rows = run_sweep(sweep, echo=lines.append)  # no cell is trained: both are finished
    assert rows[0]["status"] == "ok" and rows[0]["test"] == 0.6 and rows[0]["seed"] == "0"
    assert rows[1]["status"] == "failed" and "another config" in rows[1]["error"]
    assert lines[0] == "[1/2] seed=0: val 0.700 test 0.600 (done earlier)"


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_sweeps_expand_into_configs_that_build(path, monkeypatch):
    monkeypatch.chdir(REPO)  # sweep paths are relative to the working directory
    sweep = load_sweep(path)
    assert sweep.out.as_posix() == f"runs/sweeps/{path.stem}"
    for cell in expand(sweep):
        config = load_config(sweep.base, cell_overrides(sweep, cell))
        data = PreparedData(config.task.level, None, None, in_channels=40, edge_channels=1, out_channels=10,
                            name=config.data.name)
        build_model(config, data)


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
    base = _write(tmp_path / "base.yaml", TINY_CITY)
    sweep = load_sweep(_write(tmp_path / "s.yaml", {
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


def test_one_numeric_grid_key_is_plotted_against_its_values(tmp_path):
    entry = {"test_mean": 0.5, "test_std": 0.01, "seconds_per_epoch_mean": 1.0}
    entry["seconds_per_epoch_std"] = math.nan
    summary = [{**entry, "model.k": k} for k in ("16", "1", "4")]  # rows hold values as text
    assert numeric_axis(summary, ["model.k"]) == [16.0, 1.0, 4.0]
    assert numeric_axis([{**entry, "lr": 0.001}], ["lr"]) == [0.001]
    assert numeric_axis([{**entry, "model.attention": "kmip"}], ["model.attention"]) is None
    assert numeric_axis([{**entry, "a": 1, "b": 2}], ["a", "b"]) is None
    assert numeric_axis([{**entry, "flag": True}, {**entry, "flag": "true"}], ["flag"]) is None
    plot_summary(tmp_path / "k.png", summary, ["model.k"], "accuracy")
    assert (tmp_path / "k.png").stat().st_size > 0
