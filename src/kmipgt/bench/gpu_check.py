"""``make gpu-check``: every GPU measurement in one command, then one summary line per target.

Made for a GPU machine as it is, reaching no package registry: each target runs as a subprocess of this
interpreter with a time limit of its own, within one budget for the whole check; a target that fails or
runs out of time is reported and the next one runs. Each target writes its JSON (and its log) under the
output folder, ``summary.json`` lists every outcome, and the summary lines are printed last, one per
target: ``NAME: measured NUMBERS`` or ``NAME: failed REASON``.

``python -m kmipgt.bench.gpu_check [--out bench-out/gpu] [--peptides-root PATH] [--budget SECONDS]
[--only WORD,...]``
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kmipgt.atomic import atomic_write_text

__all__ = ["BUDGET", "Target", "main", "run_targets", "selected", "targets"]

# Seconds for the whole check: a device command may run 10 minutes, and the wheels' install and the
# interpreter's start come first.
BUDGET = 570.0
# The k-MIP epochs captured in CUDA graphs: compiled, and every batch padded to a shape sized from the data
# (for Peptides-func in batches of 200: 37,379 nodes, 76,169 edges, 285 graphs; 76,661 nodes, 157,378 edges,
# 373 graphs for a batch beyond that, which its splits do not hold).
CUDA_GRAPHS = ["optim.compile=true", "optim.cuda_graphs=true", "data.pad_to=auto"]

# Printed as JSON by the environment target: the device, the stack and the packages the bundle brings.
_ENVIRONMENT = """
import importlib, json, sys, torch
versions = {}
for name in ("torch", "triton", "torch_geometric", "pygsp", "ogb", "rdkit", "kmipgt"):
    try:
        versions[name] = getattr(importlib.import_module(name), "__version__", "present")
    except ImportError:
        versions[name] = None
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
json.dump({"gpu": gpu, "versions": versions}, open(sys.argv[1], "w"), indent=2)
"""


@dataclass(frozen=True)
class Target:
    """One measurement: ``args`` after the interpreter, its time ``limit`` in seconds, and ``summarise``,
    which turns the target's output folder into the numbers of its summary line (raising where they are
    missing). ``refused``: why it cannot run here at all (reported as its failure, nothing run)."""

    name: str
    args: list[str]
    limit: float
    summarise: Callable[[Path], str]
    refused: str | None = None


def _read(path: Path) -> dict:
    return json.loads(path.read_text())


# What only converts the original Peptides CSV: absent where `make gpu-bundle PEPTIDES_ROOT=...` carried
# the converted copy instead.
_CONVERTER = ("ogb", "rdkit")


def _environment(out: Path) -> str:
    found = _read(out / "environment.json")
    versions = found["versions"]
    missing = [name for name, version in versions.items() if version is None and name not in _CONVERTER]
    if missing:
        raise RuntimeError(f"missing {', '.join(missing)} (run make gpu-bundle and carry .whl)")
    if found["gpu"] is None:
        raise RuntimeError(f"no CUDA device visible to torch {versions['torch']}")
    listed = ", ".join(f"{name} {version or 'absent'}" for name, version in versions.items())
    return f"{found['gpu']}, {listed}"


def _pytest(out: Path) -> str:
    suite = ElementTree.parse(out / "pytest.xml").getroot().iter("testsuite")
    counts = {key: 0 for key in ("tests", "failures", "errors", "skipped")}
    for node in suite:
        for key in counts:
            counts[key] += int(node.get(key, 0))
    bad = counts["failures"] + counts["errors"]
    passed = counts["tests"] - bad - counts["skipped"]
    if passed == 0:
        raise RuntimeError(f"no test ran ({counts['skipped']} skipped: no CUDA device?)")
    return f"{passed} passed, {bad} failed, {counts['skipped']} skipped"


def _ragged(out: Path) -> str:
    records = {(r["method"], r["pass"]): r for r in _read(out / "ragged" / "ragged.json")["records"]}
    kmip = records["kmip", "forward+backward"]
    return (
        f"kmip forward+backward {kmip['time_median'] * 1e3:.3f} ms ({kmip['host_syncs']} host syncs), "
        f"full {records['full', 'forward+backward']['time_median'] * 1e3:.3f} ms, "
        f"padded SDPA {records['sdpa-padded', 'forward+backward']['time_median'] * 1e3:.3f} ms"
    )


def _step(folder: str) -> Callable[[Path], str]:
    def summarise(out: Path) -> str:
        step = _read(out / folder / "step.json")
        parts = ", ".join(f"{name} {ms:.2f}" for name, ms in step["parts_ms"].items())
        return f"step {step['step_ms']:.2f} ms ({parts} ms) on {step['device']}"

    return summarise


def _epochs(folder: str) -> Callable[[Path], str]:
    def summarise(out: Path) -> str:
        with open(out / folder / "log.csv", newline="") as file:
            seconds = [float(row["seconds"]) for row in csv.DictReader(file)]
        if len(seconds) < 2:
            raise RuntimeError(f"{len(seconds)} epoch(s) logged, 2 expected")
        return ", ".join(f"epoch {i} {s:.2f} s" for i, s in enumerate(seconds, 1))

    return summarise


def _million(out: Path) -> str:
    (point,) = _read(out / "attention-1m" / "attention.json")["points"]
    if point["status"] != "ok":
        raise RuntimeError(f"{point['status']}: {point.get('reason', '')}")
    spread = f"[{point['time_min']:.3f}–{point['time_max']:.3f}]"
    memory = f"{point['peak_memory_bytes'] / 2**20:.0f} MiB"
    return f"N = {point['n']:,}: {point['time_median']:.3f} s {spread}, {memory}"


def _compiled(out: Path) -> str:
    result = _read(out / "compile" / "compile.json")
    return (f"eager {result['eager_ms']:.2f} ms, compiled {result['compiled_ms']:.2f} ms "
            f"(x{result['ratio']:.2f}), compilation {result['compile_ms'] / 1000:.0f} s, "
            f"{result['compiled_graphs']} graph(s)")


def _shapes(out: Path) -> str:
    shapes = _read(out / "limit-shapes" / "limit_shapes.json")["shapes"]
    return ", ".join(f"{s['shape']} {s['forward_backward_ms']:.2f} ms ({s['path']})" for s in shapes)


def pytest_options() -> list[str]:
    """Options of ``pytest -m cuda`` from the plugins at hand: 8 xdist workers (they compile the kernels in
    parallel), and a limit per test, so that one hung test fails alone."""
    options = []
    if importlib.util.find_spec("xdist") is not None:
        options += ["-n", "8"]
    if importlib.util.find_spec("pytest_timeout") is not None:
        options += ["--timeout", "120"]
    return options


def _peptides_epochs(out: Path, peptides_root: str | None) -> list[Target]:
    """Two real Peptides-func epochs of the recipe's ablation, of the recipe, and of the recipe padded,
    compiled and captured in CUDA graphs; refused without a local copy. The ablation first (it reads the
    data into the cache where none was carried), the k-MIP run (which compiles the Triton kernels of each
    graph-size bucket in its first epoch) next."""
    no_root = None if peptides_root else "PEPTIDES_ROOT is not set (a local Peptides-func copy)"
    # The captured run compiles twice (training and evaluation) before its epochs: the longest limit.
    runs = (("none", "none", "epochs-none", [], 60), ("kmip", "kmip", "epochs-kmip", [], 170),
            ("kmip, CUDA graphs", "kmip", "epochs-kmip-cuda-graphs", CUDA_GRAPHS, 200))
    result = []
    for name, attention, folder, overrides, limit in runs:
        args = ["-m", "kmipgt", "train", "--config", "peptides_func",
                "--set", f"data.options.root={peptides_root}", "--set", "optim.epochs=2",
                "--set", "device=cuda", "--set", f"model.attention={attention}",
                "--set", f"out_dir={out / folder}", "--overwrite", "--no-progress"]
        args += [arg for override in overrides for arg in ("--set", override)]
        result.append(Target(f"two Peptides-func epochs {name}", args, limit, _epochs(folder), no_root))
    return result


def targets(out: Path, peptides_root: str | None, pytest_extra: list[str]) -> list[Target]:
    """The targets in the order they run; ``pytest_extra``: options of ``pytest -m cuda``. The real
    Peptides-func epochs (the LRGB table's speed) right after the tests, so that a check short of time
    cuts the kernel benchmarks, which earlier checks measured, rather than them."""
    kmipgt = ["-m", "kmipgt"]
    step = [*kmipgt, "bench", "step", "--config", "peptides_func", "--device", "cuda"]
    result = [
        Target("environment", ["-c", _ENVIRONMENT, str(out / "environment.json")], 30, _environment),
        Target("pytest -m cuda", ["-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", *pytest_extra,
                                  f"--junitxml={out / 'pytest.xml'}"], 100, _pytest),
        *_peptides_epochs(out, peptides_root),
        Target("bench step kmip", [*step, "--out", str(out / "step-kmip")], 35, _step("step-kmip")),
        Target("bench step none", [*step, "--set", "model.attention=none", "--out", str(out / "step-none")],
               30, _step("step-none")),
    ]
    compiled = [*kmipgt, "bench", "compile", "--config", "peptides_func", "--set", "device=cuda",
                "--steps", "10", "--out", str(out / "compile")]
    result.append(Target("bench compile", compiled, 100, _compiled))
    result.append(Target("bench ragged", [*kmipgt, "bench", "ragged", "--device", "cuda", "--out",
                                          str(out / "ragged")], 30, _ragged))
    million = [*kmipgt, "bench", "attention", "--device", "cuda", "--n", "1048576", "--methods", "kmip",
               "--backends", "auto", "--dim", "16", "--dim-v", "16", "-k", "16",
               "--passes", "forward+backward", "--repeats", "3", "--warmup", "1", "--time-budget", "120",
               "--out", str(out / "attention-1m")]
    result.append(Target("1M-token k-MIP forward+backward", million, 45, _million))
    shapes = ["-m", "kmipgt.bench.limit_shapes", "--device", "cuda", "--out", str(out / "limit-shapes")]
    result.append(Target("limit shapes", shapes, 30, _shapes))
    return result


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def _run(target: Target, out: Path, limit: float) -> tuple[str, str]:
    """``("measured", numbers)`` or ``("failed", reason)``; the target's output goes to its log."""
    if target.refused:
        return "failed", target.refused
    log = out / "logs" / (target.name.replace(" ", "-").replace("/", "-") + ".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([sys.executable, *target.args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=limit, check=False)
    except subprocess.TimeoutExpired as stopped:
        atomic_write_text(log, (stopped.output or b"").decode(errors="replace"))
        return "failed", f"timed out after {limit:.0f} s (log: {log})"
    atomic_write_text(log, done.stdout.decode(errors="replace"))
    try:
        numbers = target.summarise(out)
    except Exception as error:  # a target's missing or unreadable result is its failure, not the check's
        if done.returncode != 0:  # then its output says why, not the missing file
            return "failed", f"exit {done.returncode}: {_last_line(log.read_text())} (log: {log})"
        return "failed", f"{type(error).__name__}: {error} (log: {log})"
    if done.returncode != 0:
        return "failed", f"exit {done.returncode}: {numbers}; {_last_line(log.read_text())} (log: {log})"
    return "measured", numbers


def run_targets(chosen: list[Target], out: Path, budget: float) -> list[dict]:
    """Run ``chosen`` in order within ``budget`` seconds, each within its own limit and leaving a few
    seconds to each one after it; write ``summary.json``, print one line per target last, return them."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget
    outcomes = []
    for position, target in enumerate(chosen):
        reserve = 5.0 * (len(chosen) - position - 1)
        limit = max(1.0, min(target.limit, deadline - time.monotonic() - reserve))
        start = time.monotonic()
        status, detail = _run(target, out, limit)
        outcomes.append({"target": target.name, "status": status, "detail": detail,
                         "seconds": round(time.monotonic() - start, 1), "limit": round(limit, 1)})
        print(f"[{target.name}] {status} in {outcomes[-1]['seconds']} s", flush=True)
    atomic_write_text(out / "summary.json", json.dumps(outcomes, indent=2) + "\n")
    print("\nGPU check summary:")
    for outcome in outcomes:
        print(f"{outcome['target']}: {outcome['status']} {outcome['detail']}")
    return outcomes


def selected(chosen: list[Target], only: str | None) -> list[Target]:
    """The targets of ``chosen`` whose name holds one of the comma-separated words of ``only`` (all where it
    is None), in their order; ValueError naming the targets for a word that matches none."""
    if only is None:
        return chosen
    words = [word.strip() for word in only.split(",") if word.strip()]
    unmatched = [word for word in words if not any(word in target.name for target in chosen)]
    if unmatched or not words:
        names = ", ".join(target.name for target in chosen)
        raise ValueError(f"--only {only!r}: {unmatched or 'no word'} names no target; the targets: {names}")
    return [target for target in chosen if any(word in target.name for word in words)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("bench-out/gpu"), help="folder of every result")
    parser.add_argument("--peptides-root", default=None, help="local Peptides-func copy (data.options.root)")
    parser.add_argument("--budget", type=float, default=BUDGET, help="seconds for the whole check")
    parser.add_argument("--only", default=None, help="comma-separated words: run the targets whose name "
                        "holds one (e.g. 'pytest,epochs'), so that a short loan leaves time for other work")
    args = parser.parse_args(argv)
    try:
        chosen = selected(targets(args.out, args.peptides_root, pytest_options()), args.only)
    except ValueError as error:
        parser.error(str(error))
    outcomes = run_targets(chosen, args.out, args.budget)
    return 0 if all(outcome["status"] == "measured" for outcome in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
