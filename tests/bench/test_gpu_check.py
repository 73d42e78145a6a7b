"""``make gpu-check``: targets run in order, each within its limit, a failure never stops the rest, the
summary comes last; the Makefile target asks no package registry; each target's numbers are read from
the files the real commands write."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kmipgt.bench.limit_shapes as limit_shapes
from kmipgt.bench import gpu_check
from kmipgt.bench.gpu_check import Target, run_targets, targets
from kmipgt.bench.ragged import RaggedBenchConfig, run_ragged_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _writes(path: Path, text: str) -> list[str]:
    return ["-c", f"import pathlib; pathlib.Path({str(path)!r}).write_text({text!r})"]


def _first_line(path: Path) -> str:
    return path.read_text().splitlines()[0]


def test_every_target_reports_once_in_order_and_the_summary_comes_last(tmp_path, capsys):
    chosen = [
        Target("writes", _writes(tmp_path / "a.txt", "12 ms"), 30, lambda out: _first_line(out / "a.txt")),
        Target("exits 3", ["-c", "import sys; print('CUDA error: no kernel image'); sys.exit(3)"], 30,
               lambda out: "2 of 5 done"),
        Target("sleeps", ["-c", "import time; time.sleep(60)"], 1, lambda out: "never read"),
        Target("refused", ["-c", "raise SystemExit('must not run')"], 30, lambda out: "", refused="no data"),
        Target("writes nothing", ["-c", "pass"], 30, lambda out: _first_line(out / "missing.txt")),
        Target("after the failures", _writes(tmp_path / "b.txt", "3 passed"), 30,
               lambda out: _first_line(out / "b.txt")),
    ]
    outcomes = run_targets(chosen, tmp_path, budget=120)
    assert [o["status"] for o in outcomes] == ["measured", "failed", "failed", "failed", "failed", "measured"]
    details = [o["detail"] for o in outcomes]
    assert details[0] == "12 ms" and details[-1] == "3 passed"
    assert details[1].startswith("exit 3: 2 of 5 done; CUDA error: no kernel image")
    assert details[2].startswith("timed out after 1 s")
    assert details[3] == "no data"
    assert details[4].startswith("FileNotFoundError")
    summary = capsys.readouterr().out.rstrip().splitlines()[-len(chosen):]
    assert summary == [f"{o['target']}: {o['status']} {o['detail']}" for o in outcomes]
    assert json.loads((tmp_path / "summary.json").read_text()) == outcomes


def test_the_budget_bounds_every_limit_and_leaves_time_for_the_targets_after(tmp_path):
    sleep = ["-c", "import time; time.sleep(60)"]
    sleepy = [Target(f"sleep {i}", sleep, 300, lambda out: "") for i in range(2)]
    outcomes = run_targets(sleepy, tmp_path, budget=6.5)
    # The first keeps 5 s for the one after it, which gets what is left.
    assert [o["limit"] for o in outcomes] == pytest.approx([1.5, 5.0], abs=0.3)
    assert sum(o["seconds"] for o in outcomes) < 6.5 + 1


def test_the_default_targets_are_the_measurements_asked_for_within_ten_minutes(tmp_path):
    chosen = targets(tmp_path, None, ["-n", "8"])
    assert [t.name for t in chosen] == [
        "environment", "pytest -m cuda", "two Peptides-func epochs none", "two Peptides-func epochs kmip",
        "two Peptides-func epochs kmip, CUDA graphs", "bench step kmip", "bench step none", "bench compile",
        "bench ragged", "1M-token k-MIP forward+backward", "limit shapes",
    ]
    # Without the optional epochs the limits fit the budget whole.
    assert sum(t.limit for t in chosen if t.refused is None) <= gpu_check.BUDGET
    assert all("PEPTIDES_ROOT" in t.refused for t in chosen if "epochs" in t.name)
    assert all(t.refused is None for t in targets(tmp_path, "/data/lrgb", []))
    assert gpu_check.BUDGET + 20 <= 600  # the wheels' install and the start-up inside a 10-minute command
    pytest_args = chosen[1].args
    assert pytest_args[:5] == ["-m", "pytest", "-q", "-m", "cuda"] and pytest_args[7:9] == ["-n", "8"]


def _make_dry_run(*variables: str) -> str:
    done = subprocess.run(["make", "-n", "gpu-check", *variables], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return done.stdout


def test_only_runs_the_targets_it_names_in_their_order(tmp_path, capsys):
    chosen = targets(tmp_path, "/data/lrgb", [])
    picked = gpu_check.selected(chosen, "epochs, pytest")
    assert [t.name for t in picked] == [
        "pytest -m cuda", "two Peptides-func epochs none", "two Peptides-func epochs kmip",
        "two Peptides-func epochs kmip, CUDA graphs",
    ]
    assert gpu_check.selected(chosen, None) == chosen
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", str(tmp_path), "--only", "pytest,epoch5"])
    error = capsys.readouterr().err
    assert "['epoch5'] names no target" in error and "bench ragged" in error
    assert not (tmp_path / "summary.json").exists()


def test_the_make_target_uses_the_machines_python_and_no_registry():
    commands = _make_dry_run("GPU_PYTHON=/opt/torch/bin/python3")
    assert "venv" not in commands and ".venv" not in commands
    pip_calls = re.findall(r"-m pip [^;]*", commands)
    assert pip_calls and all("--no-index" in call and "download" not in call for call in pip_calls)
    assert "PYTHONPATH=src:" in commands and "/opt/torch/bin/python3 -m kmipgt.bench.gpu_check" in commands
    assert "--peptides-root /data/lrgb" in _make_dry_run("PEPTIDES_ROOT=/data/lrgb")
    assert "--only" not in commands and "--budget" not in commands
    chosen = _make_dry_run("GPU_TARGETS=pytest,epochs", "GPU_BUDGET=300")
    assert '--only "pytest,epochs"' in chosen and "--budget 300" in chosen
    # The cache is the checkout's, so that a converted Peptides copy carried with it is what is read.
    assert f"KMIPGT_CACHE={ROOT / '.gpu-cache'} /opt/torch/bin/python3 -m kmipgt.bench.gpu_check" in commands


def _bundle_dry_run(*variables: str) -> str:
    done = subprocess.run(["make", "-n", "gpu-bundle", *variables], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return " ".join(done.stdout.replace("\\\n", " ").split())


def test_the_bundle_brings_the_peptides_converter_or_the_converted_copy():
    converter = ("ogb==1.3.6", "outdated==0.2.2", "littleutils==0.2.4", "rdkit==2026.9.1")
    wheels_only = _bundle_dry_run()
    assert "-d .whl pygsp==0.6.1" in wheels_only and all(wheel in wheels_only for wheel in converter)
    assert "kmipgt data info" not in wheels_only and "rm -f" not in wheels_only
    converted = _bundle_dry_run("PEPTIDES_ROOT=data")
    assert "-d .whl pygsp==0.6.1" in converted and not any(wheel in converted for wheel in converter)
    assert "rm -f .whl/ogb-*.whl .whl/outdated-*.whl .whl/littleutils-*.whl .whl/rdkit-*.whl" in converted
    cache = f"KMIPGT_CACHE={ROOT / '.gpu-cache'}"
    assert f"{cache} .venv/bin/kmipgt data info lrgb --root data --set name=Peptides-func" in converted


# --- Each summary read from the files the real commands write ---------------------------------------


def test_pytest_counts_come_from_its_junit_report(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    assert False\n\n"
        "@pytest.mark.skip\ndef test_c():\n    pass\n"
    )
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
                    f"--junitxml={tmp_path / 'pytest.xml'}"], capture_output=True, check=False, cwd=tmp_path)
    assert gpu_check._pytest(tmp_path) == "1 passed, 1 failed, 1 skipped"
    (tmp_path / "test_sample.py").write_text("import pytest\n\n@pytest.mark.skip\ndef test_c():\n    pass\n")
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
                    f"--junitxml={tmp_path / 'pytest.xml'}"], capture_output=True, check=False, cwd=tmp_path)
    with pytest.raises(RuntimeError, match="no test ran"):
        gpu_check._pytest(tmp_path)


def test_ragged_numbers_come_from_its_json(tmp_path):
    config = RaggedBenchConfig(graphs=3, min_nodes=4, max_nodes=9, dim=4, repeats=1, warmup=0)
    run_ragged_benchmark(config, tmp_path / "ragged")
    assert re.fullmatch(
        r"kmip forward\+backward [\d.]+ ms \(None host syncs\), full [\d.]+ ms, padded SDPA [\d.]+ ms",
        gpu_check._ragged(tmp_path),
    )


def test_shapes_come_from_their_json(tmp_path, monkeypatch):
    monkeypatch.setattr(limit_shapes, "LIMIT_SHAPES", {"tiny": ("float32", 4, 3, 2, 6)})
    monkeypatch.setattr(limit_shapes, "_GRAPHS", 3)
    limit_shapes.main(["--device", "cpu", "--repeats", "1", "--out", str(tmp_path / "limit-shapes")])
    assert re.fullmatch(r"tiny [\d.]+ ms \(fused attention\)", gpu_check._shapes(tmp_path))


def test_step_epoch_and_million_numbers(tmp_path):
    (tmp_path / "step-kmip").mkdir()
    step = {"step_ms": 12.5, "parts_ms": {"data": 1.0, "attention": 2.25}, "device": "cuda:0"}
    (tmp_path / "step-kmip" / "step.json").write_text(json.dumps(step))
    assert gpu_check._step("step-kmip")(tmp_path) == "step 12.50 ms (data 1.00, attention 2.25 ms) on cuda:0"
    (tmp_path / "epochs-kmip").mkdir()
    with open(tmp_path / "epochs-kmip" / "log.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, ["epoch", "train_loss", "seconds"])
        writer.writeheader()
        writer.writerows([{"epoch": 1, "train_loss": 0.7, "seconds": 9.5}, {"epoch": 2, "train_loss": 0.6,
                                                                             "seconds": 2.25}])
    assert gpu_check._epochs("epochs-kmip")(tmp_path) == "epoch 1 9.50 s, epoch 2 2.25 s"
    (tmp_path / "attention-1m").mkdir()
    point = {"n": 1048576, "status": "ok", "time_median": 2.1, "time_min": 2.08, "time_max": 2.1,
             "peak_memory_bytes": 802 * 2**20}
    (tmp_path / "attention-1m" / "attention.json").write_text(json.dumps({"points": [point]}))
    assert gpu_check._million(tmp_path) == "N = 1,048,576: 2.100 s [2.080–2.100], 802 MiB"


def test_the_environment_target_names_what_is_missing(tmp_path):
    (environment,) = [t for t in targets(tmp_path, None, []) if t.name == "environment"]
    subprocess.run([sys.executable, *environment.args], check=True, env={"PYTHONPATH": str(ROOT / "src")})
    found = json.loads((tmp_path / "environment.json").read_text())
    assert found["versions"]["torch"] == torch.__version__
    versions = {"torch": "2.11.0+cu130", "triton": "3.6.0", "pygsp": "0.6.1"}
    for gpu, missing, message in [(None, None, "no CUDA device visible to torch 2.11.0"),
                                  ("NVIDIA H100", "pygsp", "missing pygsp .run make gpu-bundle")]:
        found = {"gpu": gpu, "versions": {**versions, **({missing: None} if missing else {})}}
        (tmp_path / "environment.json").write_text(json.dumps(found))
        with pytest.raises(RuntimeError, match=message):
            environment.summarise(tmp_path)
    (tmp_path / "environment.json").write_text(json.dumps({"gpu": "NVIDIA H100", "versions": versions}))
    assert environment.summarise(tmp_path) == "NVIDIA H100, torch 2.11.0+cu130, triton 3.6.0, pygsp 0.6.1"
    # The CSV's converter is not needed where its converted copy was carried instead.
    found = {"gpu": "NVIDIA H100", "versions": {**versions, "ogb": None, "rdkit": None}}
    (tmp_path / "environment.json").write_text(json.dumps(found))
    assert environment.summarise(tmp_path).endswith("pygsp 0.6.1, ogb absent, rdkit absent")
