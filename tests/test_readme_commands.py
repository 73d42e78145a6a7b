"""Every ``kmipgt`` line of the README's shell blocks runs as written, in order, in an empty directory.

A reader runs them after ``make setup`` and ``source .venv/bin/activate``; here each runs as
``python -m kmipgt`` with this checkout's ``src`` first on the path, in a fresh temporary directory (so
nothing may depend on the checkout as working directory) and its own cache. Lines that train get only
``--set optim.epochs=2`` (and no warm-up, an evaluation every epoch) added, so CI pays seconds per run,
not the full budget; everything else (a fast dev run, which trains a few batches and writes nothing,
included) runs exactly as the README shows it. About 30 s on 2 cores, most of it
building the labels and the fused search kernel into the test's fresh cache.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHRINK = ["--set", "optim.epochs=2", "--set", "optim.warmup_epochs=0", "--set", "optim.eval_every=1"]


def readme_commands(text: str) -> list[list[str]]:
    """The argument lists of the ``kmipgt`` lines in the ``bash``/``sh``/``shell`` blocks of ``text``,
    in order, comments dropped."""
    blocks = re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    return [shlex.split(line, comments=True) for line in lines if line.startswith("kmipgt")]


def test_readme_commands_are_found_with_their_comments_dropped():
    text = "```bash\nmake setup\nkmipgt train --set seed=1   # one seed\n```\n```python\nkmipgt = 1\n```\n"
    assert readme_commands(text) == [["kmipgt", "train", "--set", "seed=1"]]


def test_every_readme_kmipgt_line_runs_in_order(tmp_path):
    commands = readme_commands((ROOT / "README.md").read_text())
    assert any(command[1:2] == ["train"] for command in commands), "the README must show how to train"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    for command in commands:
        # `kmipgt train ...` or `kmipgt -q train ...`, but not a fast dev run (no metric, nothing to shrink)
        trains = "train" in command[1:3] and "--fast-dev-run" not in command
        arguments = command[1:] + (SHRINK if trains else [])
        done = subprocess.run(
            [sys.executable, "-m", "kmipgt", *arguments],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
        )
        shown = shlex.join(command)
        assert done.returncode == 0, f"{shown}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        if trains:
            assert re.search(r"test accuracy: 0\.\d+", done.stdout), f"{shown}: no test accuracy"

