"""A sweep's cells packed on one machine and unpacked on another: what each kind of cell carries, parts below
a size, cells started here kept, and archives that are not a sweep's refused before anything is written."""

import csv
import io
import json
import tarfile
import time

import pytest

from kmipgt.cli import main
from kmipgt.sweep import archive as archive_module
from kmipgt.sweep import cell_dir, cell_state, expand, load_sweep, run_sweep
from kmipgt.sweep.archive import archive_parts, pack, unpack
from kmipgt.sweep.time_limit import GRACE_SECONDS, TimeLimit, epochs_done
from sweep_files import TINY_CITY, write_yaml

# Epochs long enough (a 2,000-node city) that a cell is stopped well before its last one.
SLOWER_CITY = {**TINY_CITY, "data": {**TINY_CITY["data"], "options": {
    **TINY_CITY["data"]["options"], "num_nodes": 2000}}, "optim": {"epochs": 30, "warmup_epochs": 2}}


def _sweep(folder, out):
    base = write_yaml(folder / "base.yaml", TINY_CITY)
    path = write_yaml(folder / f"{out}.yaml", {"base": str(base), "grid": {"seed": [0, 1, 2]},
                                               "out": str(folder / out)})
    return load_sweep(path)


def _fake_cells(sweep):
    """Cell 0 finished, cell 1 stopped after an epoch (checkpoints of random bytes), cell 2 not started."""
    done, stopped, _ = (cell_dir(sweep, cell) for cell in expand(sweep))
    for directory in (done, stopped):
        directory.mkdir(parents=True)
        (directory / "config.yaml").write_text("seed: 0\n")
        (directory / "log.csv").write_text("epoch,seconds\n1,0.5\n")
        for name in ("last.pt", "best.pt"):
            (directory / name).write_bytes(bytes(range(256)) * 64)
        (directory / "tensorboard").mkdir()
        (directory / "tensorboard" / "events").write_text("left behind")
    (done / "metrics.json").write_text(json.dumps({"test": 0.5, "complete": True}))
    return done, stopped


def _members(parts):
    content = io.BytesIO(b"".join(part.read_bytes() for part in parts))
    with tarfile.open(fileobj=content, mode="r:gz") as archive:
        return archive.getnames()


def test_a_finished_cell_travels_without_checkpoints_an_unfinished_one_with_them(tmp_path):
    sweep = _sweep(tmp_path, "here")
    done, stopped = _fake_cells(sweep)
    (written,) = pack(sweep, tmp_path / "runs.tar.gz")
    assert written == tmp_path / "runs.tar.gz"
    assert sorted(_members([written])) == sorted(
        [f"cells/{done.name}/{name}" for name in ("config.yaml", "log.csv", "metrics.json")]
        + [f"cells/{stopped.name}/{name}" for name in ("best.pt", "config.yaml", "last.pt", "log.csv")]
    )
    there = _sweep(tmp_path, "there")
    assert unpack(there, written) == [done.name, stopped.name]
    for cell, state in zip(expand(there), ("done", "resume", "new"), strict=True):
        assert cell_state(there, cell) == state
    moved = cell_dir(there, expand(there)[1])
    for name in ("last.pt", "best.pt", "log.csv", "config.yaml"):
        assert (moved / name).read_bytes() == (stopped / name).read_bytes()
    assert not (moved / "tensorboard").exists()
    assert not (cell_dir(there, expand(there)[0]) / "last.pt").exists()


def test_a_large_archive_is_written_in_parts_and_read_whole(tmp_path, monkeypatch):
    sweep = _sweep(tmp_path, "here")
    _, stopped = _fake_cells(sweep)
    (stopped / "last.pt").write_bytes(bytes(range(256)) * 4096 + b"".join(i.to_bytes(4, "little")
                                                                          for i in range(100_000)))
    monkeypatch.setattr(archive_module, "PART_BYTES", 50_000)
    path = tmp_path / "out" / "runs.tar.gz"
    path.parent.mkdir()
    path.write_bytes(b"an earlier, smaller archive")
    parts = pack(sweep, path)
    assert len(parts) > 2
    assert [part.name for part in parts] == [f"runs.tar.gz.{i:03d}" for i in range(len(parts))]
    assert all(part.stat().st_size <= 50_000 for part in parts)
    assert archive_parts(path) == parts  # the one-file archive of before is gone
    there = _sweep(tmp_path, "there")
    unpack(there, path)
    assert (cell_dir(there, expand(there)[1]) / "last.pt").read_bytes() == (stopped / "last.pt").read_bytes()
    parts[1].unlink()
    with pytest.raises(ValueError, match="is not a whole sweep archive"):
        unpack(_sweep(tmp_path, "elsewhere"), path)


def test_a_cell_started_here_is_kept(tmp_path):
    sweep = _sweep(tmp_path, "here")
    done, stopped = _fake_cells(sweep)
    path = pack(sweep, tmp_path / "runs.tar.gz")[0]
    (stopped / "last.pt").write_bytes(b"further than the archive")
    (done / "metrics.json").write_text(json.dumps({"test": 0.75, "complete": True}))
    assert unpack(sweep, path) == []
    assert (stopped / "last.pt").read_bytes() == b"further than the archive"
    assert json.loads((done / "metrics.json").read_text())["test"] == 0.75


@pytest.mark.parametrize("name", ["cells/../../escape.txt", "/etc/escape", "cells/unknown/last.pt",
                                  "cells/x", "summary.md"])
def test_an_archive_with_anything_but_files_of_this_sweeps_cells_is_refused(tmp_path, name):
    sweep = _sweep(tmp_path, "here")
    good = f"cells/{expand(sweep)[0].name}/log.csv"
    path = tmp_path / "runs.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for member in (good, name):
            info = tarfile.TarInfo(member)
            info.size = 2
            archive.addfile(info, io.BytesIO(b"ok"))
    with pytest.raises(ValueError, match=r"is not a file of a cell of this sweep.*nothing was unpacked"):
        unpack(sweep, path)
    assert not (tmp_path / "here").exists() and not (tmp_path.parent / "escape.txt").exists()
    with pytest.raises(FileNotFoundError, match="no archive at"):
        unpack(sweep, tmp_path / "missing.tar.gz")


class _StopAfterFirstEpoch:
    """The real clock until some cell of ``cells`` has logged an epoch, then past the interruption point of a
    one-hour limit (but before its end): every cell stops at the boundary it has reached."""

    def __init__(self, cells):
        self.cells, self.moved = cells, False

    def __call__(self):
        self.moved = self.moved or any(epochs_done(cell) >= 1 for cell in self.cells.glob("*"))
        return time.monotonic() + (3600 - GRACE_SECONDS / 2 if self.moved else 0)


@pytest.mark.slow  # three sweeps of two cells, each cell its own `kmipgt train` process
def test_a_sweep_packed_when_stopped_resumes_elsewhere_to_the_uninterrupted_results(tmp_path, capsys):
    def sweep(out):
        base = write_yaml(tmp_path / "base.yaml", SLOWER_CITY)
        path = write_yaml(tmp_path / f"{out}.yaml", {"base": str(base), "grid": {"seed": [0, 1]},
                                                     "out": str(tmp_path / out)})
        return load_sweep(path)

    whole = run_sweep(sweep("whole"), jobs=2, echo=lambda line: None)
    here = sweep("here")
    limit = TimeLimit.after(3600, _StopAfterFirstEpoch(tmp_path / "here" / "cells"))
    assert {row["status"] for row in run_sweep(here, jobs=2, echo=lambda line: None, limit=limit)} == {
        "unfinished"}
    folders = [cell_dir(here, cell) for cell in expand(here)]
    assert any((folder / "last.pt").is_file() for folder in folders)  # one stopped after an epoch at least
    started = sum(any(path.is_file() for path in folder.glob("*")) for folder in folders if folder.is_dir())
    archive = tmp_path / "carried" / "runs.tar.gz"
    pack(here, archive)

    there = tmp_path / "there"  # another machine: another folder, the same sweep file
    assert main(["sweep", str(here.path), "--out", str(there), "--jobs", "2", "--unpack", str(archive)]) == 0
    assert f"unpacked {started} cells" in capsys.readouterr().out
    with open(there / "results.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for again, reference in zip(rows, whole, strict=True):
        assert again["status"] == reference["status"] == "ok"
        for column in ("train", "val", "test", "best_epoch", "epochs", "parameters"):
            assert again[column] == str(reference[column]), column  # bit for bit: the CSV's repr of floats
