"""What training tells the user: log levels (kmipgt.logs) and the optional TensorBoard scalars."""

import csv
import importlib.util
import logging
import shutil

import pytest
import torch
from torch_geometric.data import Data

from kmipgt.cli import main
from kmipgt.logs import configure_logging
from kmipgt.train import Trainer, load_config
from kmipgt.train.datasets import PreparedData


@pytest.fixture(autouse=True)
def _restore_kmipgt_logger():
    """configure_logging changes a process-wide logger; later tests get it back as it was."""
    logger = logging.getLogger("kmipgt")
    level, handlers = logger.level, list(logger.handlers)
    yield
    logger.setLevel(level)
    logger.handlers[:] = handlers


def _node_data(n=40) -> PreparedData:
    gen = torch.Generator().manual_seed(0)
    split = torch.rand(n, generator=gen)
    edge_index = torch.randint(0, n, (2, 3 * n), generator=gen)
    graph = Data(x=torch.randn(n, 4, generator=gen), edge_index=edge_index,
                 y=torch.randint(0, 2, (n,), generator=gen), train_mask=split < 0.5,
                 val_mask=(split >= 0.5) & (split < 0.75), test_mask=split >= 0.75)
    return PreparedData("node", graph, None, in_channels=4, edge_channels=0, out_channels=2, name="toy")


# What building the run of _config logs: the task read from its data, the model keys GCN does not read.
TASK = ("task: node level, cross_entropy loss, roc_auc metric (read from the data: 2 classes; set "
        "task.loss/metric to choose)")
IGNORED = "model.kind=gcn ignores these model keys: attention.k"


def _config(out_dir, *extra):
    """A GCN baseline with ``model.attention.k`` set, which GCN ignores: the run logs one warning when
    built."""
    return load_config(None, [
        f"out_dir={out_dir}", "model.kind=gcn", "model.attention.k=4", "model.channels=8",
        "model.num_layers=1", "optim.epochs=3", "optim.warmup_epochs=1", "device=cpu", *extra,
    ])


def _train(out_dir, *extra, **fit):
    return Trainer(_config(out_dir, *extra), _node_data()).fit(**fit)


def test_quiet_hides_the_progress_bar_and_keeps_warnings(tmp_path, capsys):
    _train(tmp_path / "default")
    assert "train toy" in capsys.readouterr().err  # the bar, as without any logging set up
    configure_logging(logging.WARNING)  # what --quiet asks for
    _train(tmp_path / "quiet")
    assert capsys.readouterr().err.strip().splitlines() == [IGNORED]


def test_verbose_adds_a_line_per_epoch(tmp_path, capsys):
    configure_logging(logging.DEBUG)
    configure_logging(logging.DEBUG)  # once more: still one handler, so one copy of each line
    _train(tmp_path, progress=False)
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[:2] == [TASK, IGNORED]
    assert [line.split(":")[0] for line in lines[2:]] == ["epoch 1/3", "epoch 2/3", "epoch 3/3"]
    assert all(" val " in line and " test " in line for line in lines[2:])


def test_info_shows_what_an_unconfigured_run_shows(tmp_path, capsys):
    configure_logging(logging.INFO)  # the CLI's default
    _train(tmp_path, progress=False)
    assert capsys.readouterr().err.strip().splitlines() == [TASK, IGNORED]


def _read_scalars(log_dir) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(s.step, s.value) for s in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_tensorboard_scalars_equal_log_csv_across_an_interrupted_run(tmp_path):
    pytest.importorskip("tensorboard")
    on = ("tensorboard=true",)
    _train(tmp_path, *on, stop_after=1, progress=False)
    shutil.copy(tmp_path / "last.pt", tmp_path / "epoch1.pt")
    resumed = Trainer(_config(tmp_path, *on), _node_data())
    resumed.resume()
    resumed.fit(stop_after=2, progress=False)
    # As if killed after logging epoch 2 but before its checkpoint: epoch 2 is trained (and logged) again.
    shutil.copy(tmp_path / "epoch1.pt", tmp_path / "last.pt")
    resumed = Trainer(_config(tmp_path, *on), _node_data())
    resumed.resume()
    assert resumed.fit(progress=False)["complete"]

    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    scalars = _read_scalars(tmp_path / "tensorboard")
    assert set(scalars) == set(rows[0]) - {"epoch"}
    for column, points in scalars.items():
        expected = [(int(row["epoch"]), float(row[column])) for row in rows if row[column] != ""]
        assert [step for step, _ in points] == [step for step, _ in expected], column  # each epoch once
        # TensorBoard stores float32
        assert [value for _, value in points] == pytest.approx([value for _, value in expected], rel=1e-6)


def test_tensorboard_without_the_package_names_the_extra(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    missing = lambda name, *args: None if name == "tensorboard" else find_spec(name, *args)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    out = tmp_path / "run"
    argv = ["train", "--no-progress", "--set", f"out_dir={out}", "--set", "tensorboard=true"]
    assert main(argv) == 2
    assert "pip install 'kmipgt[tensorboard]'" in capsys.readouterr().err
    assert not out.exists()  # refused before the run touched the disk


def test_tensorboard_flag_sets_the_config_key(tmp_path, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    missing = lambda name, *args: None if name == "tensorboard" else find_spec(name, *args)  # noqa: E731
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    assert main(["train", "--tensorboard", "--no-progress", "--set", f"out_dir={tmp_path / 'run'}"]) == 2
    assert "pip install 'kmipgt[tensorboard]'" in capsys.readouterr().err


@pytest.mark.parametrize(("flag", "bar", "epoch_lines"), [("--quiet", False, 0), ("--verbose", True, 1)])
def test_quiet_and_verbose_flags_set_the_level(tmp_path, capsys, flag, bar, epoch_lines):
    overrides = [f"out_dir={tmp_path}", "model.kind=gcn", "optim.epochs=1", "model.channels=8",
                 "model.num_layers=1", "device=cpu"]
    assert main([flag, "train", *(arg for key in overrides for arg in ("--set", key))]) == 0
    err = capsys.readouterr().err
    assert ("train minnesota" in err) == bar
    assert sum(line.startswith("epoch 1/1") for line in err.splitlines()) == epoch_lines
