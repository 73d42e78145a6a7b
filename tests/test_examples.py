"""The example scripts run end to end (one epoch each) and report their metric."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize(
    ("script", "metric"),
    [("kmip_in_a_pyg_model.py", r"test (\d\.\d+)"), ("point_cloud_attention.py", r"test accuracy (\d\.\d+)")],
)
def test_example_runs_and_reports_its_metric(script, metric):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--epochs", "1"],
        capture_output=True, text=True, timeout=600, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr
    value = float(re.search(metric, done.stdout).group(1))
    assert 0.0 <= value <= 1.0


@pytest.mark.parametrize("script", ["sharded_attention.py", "graph_partition_volume.py"])
def test_an_example_for_torchrun_run_plainly_says_how_to_launch_it(script):
    env = {name: value for name, value in os.environ.items()
           if name not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True,
                          timeout=300, env=env, check=False)
    assert done.returncode == 2
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{script} runs under torchrun: torchrun --standalone --nproc-per-node 2 "
                           f"examples/{script}")
