"""``distributed.strategy: ddp`` on 2 gloo ranks trains as one process with the same global batch."""

import csv
import os
import sys
from pathlib import Path

import pytest

from ddp_runs import TOY_OVERRIDES, ddp_runs, toy_config, toy_graph_splits
from kmipgt.train import load_config, train
from kmipgt.train.validation import validate_config
from spawn_ranks import run_torchrun, spawn_ranks

pytestmark = pytest.mark.distributed

TESTS = Path(__file__).resolve().parents[1]


def _log(run_dir: Path) -> list[dict[str, str]]:
    with open(run_dir / "log.csv") as f:
        return list(csv.DictReader(f))


def _columns(rows: list[dict[str, str]], *names: str) -> list[list[float]]:
    return [[float(row[name]) for row in rows] for name in names]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The run directory of the single-process reference (same config, ``strategy: none``)."""
    out = tmp_path_factory.mktemp("one_process")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("kmipgt.train.datasets.load_raw", lambda config: toy_graph_splits())
        train(toy_config(str(out), "none"), progress=False)
    return out


@pytest.fixture(scope="module")
def ddp_dirs(tmp_path_factory):
    """Run directories of the spawned 2-rank runs: ``(straight, resumed)``."""
    straight, resumed = tmp_path_factory.mktemp("ddp"), tmp_path_factory.mktemp("ddp_resumed")
    spawn_ranks(ddp_runs, 2, str(tmp_path_factory.mktemp("cache")), str(straight), str(resumed))
    return straight, resumed


def test_ddp_losses_and_metrics_equal_one_process(one_process, ddp_dirs):
    expected, got = _log(one_process), _log(ddp_dirs[0])
    assert len(got) == len(expected) == 3
    for name in ("train_loss", "val", "test"):
        (want,), (have,) = _columns(expected, name), _columns(got, name)
        assert have == pytest.approx(want, rel=1e-5), name


def test_ddp_resume_equals_the_uninterrupted_run(ddp_dirs):
    straight, resumed = (_columns(_log(d), "train_loss", "val") for d in ddp_dirs)
    for want, have in zip(straight, resumed, strict=True):
        assert have == pytest.approx(want, rel=1e-6)
    assert (ddp_dirs[1] / "metrics.json").is_file() and (ddp_dirs[1] / "best.pt").is_file()


def test_torchrun_runs_the_command_on_two_ranks(tmp_path, one_process):
    """``torchrun -m`` style launch of the CLI (here: the CLI with the toy graphs) gives the same losses,
    also with ``data.on_device`` (each rank cuts its share of every batch from the resident splits)."""
    out = tmp_path / "run"
    overrides = [*TOY_OVERRIDES, f"out_dir={out}", "distributed.strategy=ddp", "data.on_device=true"]
    sets = [arg for item in overrides for arg in ("--set", item)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KMIPGT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
    args = ["--nproc-per-node", "2", str(TESTS / "ddp_runs.py"), "train", "--no-progress",
            "--config", str(TESTS / "defaults.yaml"), *sets]
    result = run_torchrun(args, env, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    (want,), (have,) = _columns(_log(one_process), "train_loss"), _columns(_log(out), "train_loss")
    assert have == pytest.approx(want, rel=1e-5)


def test_ddp_needs_graph_level_and_a_torchrun_launch(tmp_path, monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match="runs under torchrun"):
        train(toy_config(str(tmp_path / "run"), "ddp"), progress=False)
    with pytest.raises(ValueError, match=r"task\.level 'node'"):
        validate_config(load_config(None, ["distributed.strategy=ddp", "task.level=node"]))
    with pytest.raises(ValueError, match=r"distributed\.strategy"):
        validate_config(load_config(None, ["distributed.strategy=fsdp"]))
