"""`kmipgt analysis curves`: several runs' learning curves on one plot, and their best epochs as a table."""

import csv
import json
from pathlib import Path

import pytest
import yaml

from kmipgt.cli import main
from kmipgt.train.report import read_history
from tiny_runs import train_tiny_city


def _run(folder: Path, metric: str, val: list[float | None], test: list[float | None]) -> Path:
    """A run directory with the two files the command reads: config.yaml and log.csv."""
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump({"task": {"metric": metric}}))
    with open(folder / "log.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["epoch", "lr", "train_loss", "val", "test", "seconds"])
        for epoch, (v, t) in enumerate(zip(val, test, strict=True), start=1):
            writer.writerow([epoch, 0.001, 1.0 / epoch, "" if v is None else v, "" if t is None else t, 2.0])
    return folder


def _table(printed: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in printed.splitlines()[2:-1]]


def test_the_table_gives_each_runs_first_best_validation_epoch(tmp_path, capsys):
    first = _run(tmp_path / "a", "ap", [None, 0.5, None, 0.7, 0.7, 0.6], [None, 0.4, None, 0.65, 0.68, 0.6])
    second = _run(tmp_path / "b", "ap", [None, None, None], [None, None, None])  # not evaluated yet
    out = tmp_path / "figs" / "curves.png"
    code = main(["analysis", "curves", str(first), str(second), "--labels", "kmip,none", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    assert printed.splitlines()[0] == "| run | label | epochs | best epoch | val ap | test ap |"
    # Epochs 4 and 5 tie on val: the first one is kept, as training keeps its checkpoint.
    assert _table(printed) == [[str(first), "kmip", "6", "4", "0.7000", "0.6500"],
                               [str(second), "none", "3", "-", "-", "-"]]
    assert out.stat().st_size > 1000


def test_for_mae_the_lowest_validation_error_is_best(tmp_path, capsys):
    run = _run(tmp_path / "r", "mae", [0.4, 0.3, 0.35], [0.5, 0.31, 0.2])
    assert main(["analysis", "curves", str(run), "--out", str(tmp_path / "c.png")]) == 0
    assert _table(capsys.readouterr().out) == [[str(run), "r", "3", "2", "0.3000", "0.3100"]]


def test_runs_with_the_same_folder_name_are_labelled_by_their_paths(tmp_path, capsys):
    runs = [_run(tmp_path / sweep / "seed=0", "ap", [0.5], [0.4]) for sweep in ("a", "b")]
    assert main(["analysis", "curves", *map(str, runs), "--out", str(tmp_path / "c.png")]) == 0
    assert [row[1] for row in _table(capsys.readouterr().out)] == [str(run) for run in runs]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda root: [_run(root / "a", "ap", [0.5], [0.5]), root / "missing"], "has no log.csv"),
        (lambda root: [_run(root / "a", "ap", [0.5], [0.5]), _run(root / "b", "mae", [1.0], [1.0])],
         "different metrics: ap, mae"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, capsys, make, message):
    runs = make(tmp_path)
    assert main(["analysis", "curves", *map(str, runs), "--out", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kmipgt: error: ") and message in err and not (tmp_path / "c.png").exists()
    assert main(["analysis", "curves", *map(str, runs[:1]), "--labels", "x,y"]) == 2
    assert "--labels names 2 runs, 1 are given" in capsys.readouterr().err


@pytest.mark.slow
def test_a_trained_runs_log_is_read_as_written(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[2])
    train_tiny_city(tmp_path / "run")
    history = read_history(tmp_path / "run")
    assert [row["epoch"] for row in history] == [1.0, 2.0]
    assert all(isinstance(row["train_loss"], float) for row in history)
    capsys.readouterr()
    assert main(["analysis", "curves", str(tmp_path / "run"), "--out", str(tmp_path / "c.png")]) == 0
    (row,) = _table(capsys.readouterr().out)
    # The Trainer's own choice of checkpoint, and its test metric, from metrics.json.
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert row[1:4] == ["run", "2", str(metrics["best_epoch"])]
    assert row[5] == f"{metrics['test']:.4f}"
