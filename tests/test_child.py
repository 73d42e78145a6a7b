"""Child processes (sweep cells, benchmark points) import nothing from their working folder and run this
copy of kmipgt."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import kmipgt
from kmipgt.bench.isolation import run_isolated
from kmipgt.cli import main
from planted import plant_modules
from sweep_files import TINY_CITY, write_yaml


def test_the_planted_modules_would_run_under_python_m(tmp_path):
    # Otherwise the tests below would prove nothing: `python -m` imports from the working folder.
    marker = tmp_path / "marker"
    plant_modules(tmp_path, marker)
    env = {**os.environ, "PYTHONPATH": str(Path(kmipgt.__file__).parents[1])}
    subprocess.run([sys.executable, "-m", "kmipgt.bench.isolation", "builtins:dict", "{}"], cwd=tmp_path,
                   env=env, capture_output=True, check=False)
    assert marker.exists()


def test_a_benchmark_child_imports_nothing_from_its_working_folder(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    plant_modules(tmp_path, marker)
    monkeypatch.chdir(tmp_path)
    result = run_isolated("builtins:dict", {"n": 3}, timeout=120)
    assert result["status"] == "ok" and result["n"] == 3
    assert not marker.exists()


def test_a_sweep_cell_imports_nothing_from_the_working_folder(tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    plant_modules(tmp_path, marker)
    base = write_yaml(tmp_path / "base.yaml", {**TINY_CITY, "optim": {"epochs": 1, "warmup_epochs": 0}})
    sweep = write_yaml(tmp_path / "s.yaml", {"base": str(base), "grid": {"seed": [0]}, "out": "out"})
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", str(sweep)]) == 0
    with open(tmp_path / "out" / "results.csv", newline="") as f:
        assert [row["status"] for row in csv.DictReader(f)] == ["ok"]
    assert not marker.exists()
