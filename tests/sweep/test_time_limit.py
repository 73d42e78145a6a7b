"""A sweep under a time limit: every cell stopped at an epoch boundary with its last.pt, marked with the
epoch it reached, and the same sweep run again ends with the results of an uninterrupted one, bit for
bit on the CPU."""

import csv
import time

import pytest

from kmipgt.cli import main
from kmipgt.sweep import load_sweep, run_sweep, write_reports
from kmipgt.sweep.time_limit import GRACE_SECONDS, TimeLimit, epochs_done
from kmipgt.train.checkpoint import load_checkpoint
from sweep_files import TINY_CITY, write_yaml

EPOCHS = 30
# Epochs long enough (a 2,000-node city) that a cell is stopped well before its last one.
SLOWER_CITY = {**TINY_CITY, "data": {**TINY_CITY["data"], "options": {
    **TINY_CITY["data"]["options"], "num_nodes": 2000}}, "optim": {"epochs": EPOCHS, "warmup_epochs": 2}}


class _Clock:
    """Seconds that tick with the real clock from ``start``, and can be moved on by hand."""

    def __init__(self, start=100.0):
        self.now = start

    def __call__(self):
        return self.now


def test_the_limit_stops_cells_whose_next_epoch_would_not_end_in_time():
    clock = _Clock()
    limit = TimeLimit.after(50, clock)
    assert limit.end == 150 and limit.interrupt_at == 145  # a tenth of a short limit is kept free
    assert TimeLimit.after(600, clock).interrupt_at == 100 + 600 - GRACE_SECONDS
    assert limit.next_epoch_fits([]) and limit.next_epoch_fits([10.0, 44.0])
    assert not limit.next_epoch_fits([10.0, 45.0])  # its longest epoch would end at the interruption point
    assert not limit.due()
    clock.now = 145
    assert limit.due() and not limit.next_epoch_fits([])
    with pytest.raises(ValueError, match="time limit must be a positive number of seconds"):
        TimeLimit.after(0)


def _read(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


class _StopAfterEpochs:
    """The real clock until some cell of ``cells`` has logged ``epochs`` epochs, then past the interruption
    point of a one-hour limit (but before its end)."""

    def __init__(self, cells, epochs):
        self.cells, self.epochs, self.moved = cells, epochs, False

    def __call__(self):
        self.moved = self.moved or any(epochs_done(cell) >= self.epochs for cell in self.cells.glob("*"))
        return time.monotonic() + (3600 - GRACE_SECONDS / 2 if self.moved else 0)


@pytest.mark.slow  # three sweeps of two cells, each cell its own `kmipgt train` process
def test_a_sweep_stopped_by_its_limit_resumes_to_the_uninterrupted_results(tmp_path):
    base = write_yaml(tmp_path / "base.yaml", SLOWER_CITY)
    files = {}
    for name in ("whole", "limited"):
        files[name] = write_yaml(tmp_path / f"{name}.yaml", {
            "base": str(base), "grid": {"seed": [0, 1]}, "out": str(tmp_path / name)})
    whole = run_sweep(load_sweep(files["whole"]), jobs=2, echo=lambda line: None)

    sweep = load_sweep(files["limited"])
    clock = _StopAfterEpochs(tmp_path / "limited" / "cells", epochs=2)
    lines = []
    rows = run_sweep(sweep, jobs=2, echo=lines.append, limit=TimeLimit.after(3600, clock))
    assert {row["status"] for row in rows} == {"unfinished"}
    reached = [int(row["epochs"]) for row in rows]
    assert max(reached) >= 2 and all(epochs < EPOCHS for epochs in reached)
    assert any(f"unfinished at epoch {epochs} of {EPOCHS} (time limit)" in line
               for line in lines for epochs in reached)
    for row, epochs in zip(rows, reached, strict=True):  # each stopped at a boundary its last.pt holds
        last = tmp_path / "limited" / "cells" / row["cell"] / "last.pt"
        if epochs:  # one more where it was stopped between writing last.pt and its log row
            assert load_checkpoint(last, keys=("state",))["state"]["epoch"] in (epochs, epochs + 1)
    write_reports(sweep, rows, "kmipgt sweep limited.yaml --time-limit=3600")
    summary = (tmp_path / "limited" / "summary.md").read_text()
    for row in rows:
        assert f"- `{row['cell']}`: epoch {row['epochs']}" in summary
    assert _read(tmp_path / "limited" / "summary.csv")[0]["unfinished"] == "2"

    resumed = run_sweep(sweep, jobs=2, echo=lambda line: None)
    for again, reference in zip(resumed, whole, strict=True):
        assert again["status"] == reference["status"] == "ok"
        for column in ("train", "val", "test", "best_epoch", "epochs", "parameters"):
            assert again[column] == reference[column], column  # bit for bit: floats compared exactly


@pytest.mark.slow  # `kmipgt sweep` and the processes it starts
def test_cells_left_without_time_are_marked_unfinished_and_the_command_says_how_to_resume(tmp_path, capsys):
    base = write_yaml(tmp_path / "base.yaml", TINY_CITY)
    path = write_yaml(tmp_path / "s.yaml", {"base": str(base), "grid": {"seed": [0, 1, 2]},
                                            "out": str(tmp_path / "out")})
    # One second leaves no cell time for an epoch: a cell's process takes longer to import torch.
    assert main(["sweep", str(path), "--jobs", "2", "--time-limit", "1"]) == 0
    printed = capsys.readouterr().out
    assert "all stopped within 1 s" in printed and "3 unfinished: run the same command again" in printed
    rows = _read(tmp_path / "out" / "results.csv")
    assert [(row["status"], row["epochs"]) for row in rows] == [("unfinished", "0")] * 3
    assert "--time-limit=1" in (tmp_path / "out" / "summary.md").read_text()
    assert main(["sweep", str(path), "--jobs", "2"]) == 0
    assert {row["status"] for row in _read(tmp_path / "out" / "results.csv")} == {"ok"}
