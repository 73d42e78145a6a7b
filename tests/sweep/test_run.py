"""Running a sweep: per-cell processes through `kmipgt sweep`, failures kept per cell, resume, reuse."""

import csv
import json

import numpy as np
import pytest
import yaml

from kmipgt.cli import main
from kmipgt.sweep import cell_dir, cell_overrides, expand, load_sweep, run_sweep
from kmipgt.train.config import config_to_dict, load_config
from sweep_files import TINY_CITY, write_yaml


def _read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # five `kmipgt train` processes, each importing torch and PyG
def test_sweep_runs_cells_keeps_failures_resumes_and_summarises(tmp_path, capsys):
    base = write_yaml(tmp_path / "base.yaml", TINY_CITY)
    out = tmp_path / "sweep"
    # seed=-1 is refused by NumPy in the cell's process: a crash that must stay in its cell.
    path = write_yaml(tmp_path / "s.yaml", {
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
    base = write_yaml(tmp_path / "base.yaml", TINY_CITY)
    content = {"base": str(base), "grid": {"seed": [0, 1]}, "out": str(tmp_path / "o")}
    path = write_yaml(tmp_path / "s.yaml", content)
    sweep = load_sweep(path)
    metrics = {"metric": "accuracy", "train": 0.9, "val": 0.7, "test": 0.6, "best_epoch": 2, "epochs": 2,
               "seconds_per_epoch": 0.1, "peak_memory_mb": 100.0, "parameters": 10, "complete": True}
    for cell, extra in zip(expand(sweep), ([], ["optim.lr=0.5"]), strict=True):  # seed=1: trained otherwise
        directory = cell_dir(sweep, cell)
        directory.mkdir(parents=True)
        config = config_to_dict(load_config(base, [*cell_overrides(sweep, cell), *extra]))
        write_yaml(directory / "config.yaml", config)
        (directory / "metrics.json").write_text(json.dumps(metrics))
    lines = []
    rows = run_sweep(sweep, echo=lines.append)  # no cell is trained: both are finished
    assert rows[0]["status"] == "ok" and rows[0]["test"] == 0.6 and rows[0]["seed"] == "0"
    assert rows[1]["status"] == "failed" and "another config" in rows[1]["error"]
    assert lines[0] == "[1/2] seed=0: val 0.700 test 0.600 (done earlier)"
