"""``make lrgb-table``: the Peptides-func table's sweep on a GPU machine as ``make gpu-check`` runs there (its
own Python, the carried wheels, no registry), the data converted once before the cells start, and a few
files out: the summary, the results and the archive that resumes the cells on the next machine."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _make(*variables: str, dry_run: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["make", *(["-n"] if dry_run else []), "lrgb-table", *variables], cwd=ROOT,
                          capture_output=True, text=True, check=False)


def test_the_table_runs_on_the_machines_python_with_the_wheels_of_gpu_check():
    commands = _make("GPU_PYTHON=/opt/torch/bin/python3", "PEPTIDES_ROOT=.data/lrgb").stdout
    assert "venv" not in commands
    pip_calls = re.findall(r"-m pip [^;]*", commands)
    assert len(pip_calls) == 1 and "--no-index" in pip_calls[0]
    assert "--target /tmp/kmipgt-gpu-site" in pip_calls[0]
    cache = ROOT / ".gpu-cache"  # where a converted copy carried with the checkout lies
    python = f"PYTHONPATH=src:/tmp/kmipgt-gpu-site KMIPGT_CACHE={cache} /opt/torch/bin/python3 -m kmipgt"
    convert = commands.index(f"{python} data info lrgb --root .data/lrgb")
    sweep = commands.index(f"{python} sweep sweeps/lrgb_peptides_table")
    assert convert < sweep  # every core converts the CSV once, before the cells would each convert it
    line = " ".join(commands[sweep:].replace("\\\n", " ").split())
    for option in ("--set data.options.root=.data/lrgb", "--set threads=1", "--jobs 6", "--time-limit 540",
                   "--pack bench-out/lrgb/runs.tar.gz"):
        assert option in line, option
    assert "--unpack" not in line
    assert "cat bench-out/lrgb/summary.md; exit $status" in line


def test_a_carried_archive_resumes_and_every_choice_has_its_variable():
    commands = _make("PEPTIDES_ROOT=/data/lrgb", "RESUME=.carry/runs.tar.gz", "JOBS=auto", "TIME_LIMIT=300",
                     "LRGB_OUT=/tmp/out", "SWEEP_SET=optim.compile=true seed=1").stdout
    line = " ".join(commands.replace("\\\n", " ").split())
    expected = ("--unpack .carry/runs.tar.gz", "--jobs auto", "--time-limit 300",
                "--pack /tmp/out/runs.tar.gz", "--set optim.compile=true --set seed=1", "/tmp/out/summary.md")
    for option in expected:
        assert option in line, option


def test_without_peptides_root_it_says_what_is_needed():
    done = _make("GPU_PYTHON=true", dry_run=False)  # `true -m pip ...` installs nothing where wheels are
    assert done.returncode != 0
    assert "PEPTIDES_ROOT=<folder holding peptides-functional/> is needed" in done.stdout
