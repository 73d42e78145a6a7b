"""The torch range kmipgt asks for is the range `make compat` passed on: pyproject.toml, the record
docs/data/torch_compat.csv and the table of docs/compatibility.md say the same."""

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("+")[0].split("."))


def _records() -> list[dict[str, str]]:
    with (ROOT / "docs" / "data" / "torch_compat.csv").open() as f:
        return list(csv.DictReader(f))


def _pin() -> tuple[tuple[int, ...], tuple[int, ...]]:
    # The dependency list's torch entry (pyproject.toml is read as text: tomllib needs Python 3.11).
    [torch] = re.findall(r'^    "(torch[^_"]*)",$', (ROOT / "pyproject.toml").read_text(), flags=re.MULTILINE)
    match = re.fullmatch(r"torch>=([\d.]+),<([\d.]+)", torch)
    assert match, f"torch's requirement is not a range >=A,<B: {torch}"
    return _release(match.group(1)), _release(match.group(2))


def test_the_pin_is_the_range_of_releases_that_passed():
    low, high = _pin()
    passed = sorted(_release(r["torch"]) for r in _records() if r["result"] == "passed")
    assert passed, "no release has passed make compat"
    assert low == passed[0][: len(low)], f"the floor {low} is not the oldest release that passed {passed[0]}"
    newest = passed[-1]
    assert high == (newest[0], newest[1] + 1), f"the cap {high} is not the minor release after {newest}"
    failed_inside = [r["torch"] for r in _records()
                     if r["result"] != "passed" and low <= _release(r["torch"])]
    assert failed_inside == [], f"releases inside the pin failed make compat: {failed_inside}"


def test_the_docs_table_shows_the_record():
    page = (ROOT / "docs" / "compatibility.md").read_text()
    row = r"^\| (\d[\d.]*) \| (.+?) \| (.+?) \| (.+?) \| (\d{4}-\d\d-\d\d) \|$"
    rows = re.findall(row, page, flags=re.MULTILINE)
    assert rows == [(r["torch"], r["result"], r["tests"], r["python"], r["date"]) for r in _records()]


def test_the_library_names_the_same_oldest_torch():
    from kmipgt.ops.library import OLDEST_TORCH

    assert _release(OLDEST_TORCH) == _pin()[0]


def test_an_older_torch_stops_the_import_naming_the_oldest():
    import kmipgt

    code = ("import torch\nfrom torch.torch_version import TorchVersion\n"
            "torch.__version__ = TorchVersion('2.9.1+cu128')\nimport kmipgt.ops\n")
    env = {**os.environ, "PYTHONPATH": str(Path(kmipgt.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 1
    error = done.stderr.splitlines()[-1]
    assert error == "ImportError: kmipgt needs torch 2.10 or later, got torch 2.9.1+cu128"
