"""Check kmipgt against one PyTorch release as a user would install it: `make compat TORCH=VERSION`.

A fresh venv gets ``torch==VERSION`` first, then kmipgt's own wheel (built here, pure Python) with no
constraint of ours, as ``pip install kmipgt`` would run beside a user's torch. The check fails if that
install changed any torch-related package (torch, triton, the nvidia libraries). Then, against the
installed wheel rather than ``src/``: a quick subset of the tests (the operators, the modules, a fast
dev run of every embedded config, predict, export) and the main job as ``kmipgt train --fast-dev-run``.

Prints one line per version and records it in docs/data/torch_compat.csv (version, result, tests, date),
which docs/compatibility.md's table is made from.

The machine's pip may cap torch (a constraint file in its configuration); ``PIP_CONSTRAINT`` replaces
that file for these installs only, so releases above the cap can be checked.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / ".compat"
RECORD = ROOT / "docs" / "data" / "torch_compat.csv"
FIELDS = ["torch", "result", "tests", "python", "date"]
TEST_PATHS = [
    "tests/ops",
    "tests/nn",
    "tests/train/test_fast_dev_run.py",
    "tests/train/test_predict.py",
    "tests/train/test_export.py",
]
# Packages whose versions the wheel's install must leave as the user had them.
TORCH_RELATED = re.compile(r"^(torch|triton|nvidia-.*|pytorch-triton.*)$", re.IGNORECASE)


def _run(command: list[str], env: dict[str, str], log, **kwargs) -> subprocess.CompletedProcess:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    return subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True, **kwargs)


def _pip_env(constraint: Path) -> dict[str, str]:
    return {**os.environ, "PIP_CONSTRAINT": str(constraint), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def build_wheel(log) -> Path:
    """kmipgt's wheel in .compat/dist; RuntimeError unless it is pure Python (no compiled code)."""
    dist = WORK / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    done = _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
                dict(os.environ), log)
    wheels = sorted(dist.glob("kmipgt-*.whl"))
    if done.returncode or len(wheels) != 1:
        raise RuntimeError(f"building kmipgt's wheel failed: see {log.name}")
    if not wheels[0].name.endswith("-py3-none-any.whl"):
        raise RuntimeError(f"kmipgt's wheel is platform-specific: {wheels[0].name}")
    return wheels[0]


def torch_related(python: Path) -> dict[str, str]:
    """The torch-related packages of ``python``'s environment, name -> version."""
    listed = subprocess.run([str(python), "-m", "pip", "list", "--format=freeze"], capture_output=True,
                            text=True, check=True).stdout
    pairs = (line.split("==", 1) for line in listed.splitlines() if "==" in line)
    return {name.lower(): version for name, version in pairs if TORCH_RELATED.match(name)}


def install(version: str, venv: Path, wheel: Path, log) -> str | None:
    """A venv with ``torch==version``, then the wheel and the test tools; the failure, or None."""
    shutil.rmtree(venv, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    pinned, free = venv / "torch-pin.txt", venv / "no-constraint.txt"
    pinned.write_text(f"torch=={version}\n")
    free.write_text("")
    torch_install = [str(python), "-m", "pip", "install", "-q", f"torch=={version}"]
    if _run(torch_install, _pip_env(pinned), log).returncode:
        return f"torch=={version} did not install"
    before = torch_related(python)
    if _run([str(python), "-m", "pip", "install", "-q", str(wheel)], _pip_env(free), log).returncode:
        return "the wheel did not install beside it"
    after = torch_related(python)
    log.write(f"torch-related packages before the wheel: {before}\nand after: {after}\n")
    if after != before:
        changed = sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
        return f"installing the wheel changed {', '.join(changed)}"
    tools = [str(python), "-m", "pip", "install", "-q", "pytest>=7.4", "hypothesis>=6"]
    if _run(tools, _pip_env(pinned), log).returncode:
        return "pytest did not install"
    return None


def run_checks(venv: Path, log) -> tuple[str | None, str]:
    """The test subset and the main job in ``venv``; (the failure or None, pytest's closing line)."""
    python, env = venv / "bin" / "python", {**os.environ, "KMIPGT_CACHE": str(venv / "cache")}
    env.pop("PYTHONPATH", None)
    where = subprocess.run([str(python), "-c", "import kmipgt; print(kmipgt.__file__)"], capture_output=True,
                           text=True, env=env, cwd=venv)
    if not where.stdout.startswith(str(venv)):
        return f"kmipgt imported from {where.stdout.strip() or where.stderr.strip()[-200:]}", ""
    tests = _run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "pythonpath=tests",
                  "-m", "not slow and not distributed and not cuda", *TEST_PATHS], env, log, cwd=ROOT)
    log.flush()
    lines = Path(log.name).read_text().splitlines()
    counts = (line.strip("= ") for line in reversed(lines) if re.search(r"\d+ (passed|failed)", line))
    closing = next(counts, "")
    if tests.returncode:
        return "tests failed", closing
    job = _run([str(venv / "bin" / "kmipgt"), "train", "--fast-dev-run"], env, log, cwd=venv)
    return ("kmipgt train --fast-dev-run failed" if job.returncode else None), closing


def record(row: dict[str, str]) -> None:
    """``row`` into RECORD, replacing the row of the same torch version."""
    rows = []
    if RECORD.exists():
        with RECORD.open() as f:
            rows = [r for r in csv.DictReader(f) if r["torch"] != row["torch"]]
    rows.append(row)
    rows.sort(key=lambda r: tuple(int(p) for p in re.findall(r"\d+", r["torch"])))
    with RECORD.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="a PyTorch release, e.g. 2.14.1")
    parser.add_argument("--keep", action="store_true", help="keep the venv (several GB) after the check")
    parser.add_argument("--no-record", action="store_true", help=f"do not write {RECORD.relative_to(ROOT)}")
    args = parser.parse_args()
    WORK.mkdir(exist_ok=True)
    venv, started = WORK / f"torch-{args.version}", time.monotonic()
    with (WORK / f"torch-{args.version}.log").open("w") as log:
        wheel = build_wheel(log)
        failure, closing = install(args.version, venv, wheel, log), ""
        if failure is None:
            failure, closing = run_checks(venv, log)
        version_code = "import sys; print(sys.version.split()[0])"
        python = subprocess.run([str(venv / "bin" / "python"), "-c", version_code], capture_output=True,
                                text=True).stdout.strip()
    if not args.keep:
        shutil.rmtree(venv, ignore_errors=True)
    result = "passed" if failure is None else f"failed: {failure}"
    print(f"torch {args.version}: {result}; {closing or 'no tests ran'} "
          f"({time.monotonic() - started:.0f} s, log {log.name})")
    if not args.no_record:
        record({"torch": args.version, "result": result, "tests": closing, "python": python,
                "date": datetime.date.today().isoformat()})
    return 0 if failure is None else 1


if __name__ == "__main__":
    sys.exit(main())
