"""Run directories and the CLI under bad input and faults (docs/reliability.md)."""

import errno
import io
import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

import kmipgt
import kmipgt.cpus
from kmipgt.cli import main
from kmipgt.train.checkpoint import load_checkpoint, save_checkpoint
from tiny_runs import TINY_DIGITS

BASE = TINY_DIGITS


def _train(out, *extra, epochs=2):
    run = ["--set", f"out_dir={out}", "--set", f"optim.epochs={epochs}"]
    return main(["train", "--no-progress", *BASE, *run, *extra])


def _error_line(capsys):
    # The run's first line, what it read its task as from the data, is information before any error.
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("task: ")]
    assert len(err) == 1 and err[0].startswith("kmipgt: error: "), err
    return err[0]


def test_a_run_directory_is_never_overwritten_silently(tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(out) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    capsys.readouterr()
    assert _train(out, "--set", "model.attention.k=2") == 2
    line = _error_line(capsys)
    assert "already holds a finished run" in line and "--overwrite" in line and "--resume" in line
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert _train(out, "--overwrite", "--set", "model.attention.k=2") == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["model"]["attention"]["k"] == 2


def test_overwrite_also_removes_branch_plots_and_tensorboard_scalars(tmp_path):
    out = tmp_path / "run"
    assert _train(out) == 0
    (out / "branches.png").write_bytes(b"old")
    (out / "tensorboard").mkdir()
    (out / "tensorboard" / "events.out.tfevents.old").write_bytes(b"old")
    assert _train(out, "--overwrite") == 0
    assert not (out / "branches.png").exists() and not (out / "tensorboard").exists()


def test_resume_compares_resolved_out_dirs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert _train("runs/x", "--stop-after", "1") == 0
    assert _train("./runs/x/", "--resume") == 0
    assert load_checkpoint(Path("runs/x/last.pt"), keys=("state",))["state"]["epoch"] == 2


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("optim.epochs=0", "optim.epochs"),
        ("optim.epochs=-3", "optim.epochs"),
        ("optim.eval_every=0", "optim.eval_every"),
        ("optim.warmup_epochs=-1", "optim.warmup_epochs"),
        ("optim.lr=0", "optim.lr"),
        ("task.loss=crossentropy", "task.loss"),
        ("task.metric=acc", "task.metric"),
        ("model.kind=gsp", "model.kind"),
        ("model.attention=kmips", "model.attention.kind"),
        ("model.dropout=1.5", "model.dropout"),
        ("model.attention.heads=0", "model.attention.heads"),
        ("data.name=minesota", "data.name"),
        ("data.val_edges=0.6", "data.val_edges"),
        ("threads=0", "threads"),
        ("device=gpu0", "device"),
    ],
)
def test_bad_config_values_exit_2_before_touching_the_disk(tmp_path, capsys, override, key):
    out = tmp_path / "run"
    assert _train(out, "--set", override, "--set", "data.test_edges=0.5") == 2
    assert f"config key{'s' if key == 'data.val_edges' else ''} '{key}'" in _error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--stop-after", "0"],
        ["train", "--stop-after", "-2"],
        ["train", "--resume", "--overwrite"],
        ["bench", "attention", "--n", ",,,"],
        ["bench", "search", "--n", "1,x"],
        ["bench", "attention", "--dtype", "int8"],
        ["bench", "step", "--config", "peptides_func", "--steps", "0"],
    ],
)
def test_bad_options_are_one_line_usage_errors(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert "(see kmipgt " in _error_line(capsys)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["bench", "attention", "--n", "8", "--heads", "0"], "`heads` must be > 0"),
        (["bench", "attention", "--n", "8", "--backends", "fast"], "`backends` must be among"),
        (["bench", "search", "--n", "8", "--k", "0"], "`k` must be > 0"),
        (["bench", "search", "--n", "8", "--backends", "magic"], "`backends` must be among"),
        (["bench", "step", "--config", "peptides_func", "--warmup", "-1"], "warmup must be an int >= 0"),
        (["bench", "step", "--config", "peptides_func", "--set",
          "model.attention.k=0"], "'model.attention.k' must be >= 1"),
    ],
)
def test_bad_bench_options_exit_2(argv, match, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path / "bench")]) == 2
    assert match in _error_line(capsys)
    assert not (tmp_path / "bench").exists()


def test_runtime_failures_exit_1_and_debug_shows_the_traceback(tmp_path, capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise RuntimeError("the kernel broke\nsecond line")

    monkeypatch.setattr("kmipgt.train.loop.Trainer.fit", fail)
    assert _train(tmp_path / "a") == 1
    assert _error_line(capsys) == "kmipgt: error: the kernel broke"
    assert main(["--debug", "train", "--no-progress", *BASE, "--set", f"out_dir={tmp_path / 'b'}"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.strip().endswith("kmipgt: error: the kernel broke")


def test_corrupt_config_and_checkpoints_name_the_file(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [k: 4\n")
    assert main(["train", "--config", str(bad)]) == 2
    assert f"{bad} is not valid YAML" in _error_line(capsys)

    out = tmp_path / "run"
    assert _train(out, "--stop-after", "1") == 0
    capsys.readouterr()
    for name in ("last.pt", "best.pt"):
        path = out / name
        path.write_bytes(path.read_bytes()[:100])
    assert _train(out, "--resume") == 2
    assert f"{out / 'last.pt'} is not a readable checkpoint" in _error_line(capsys)
    assert main(["eval", str(out)]) == 2
    assert f"{out / 'best.pt'} is not a readable checkpoint" in _error_line(capsys)


def test_threads_are_saved_with_the_run_and_reused_on_resume(tmp_path, capsys, monkeypatch):
    out = tmp_path / "run"
    unset = [arg for arg in BASE if arg != "threads=1"][:-1]  # drop "--set threads=1"
    argv = ["train", "--no-progress", *unset, "--set", f"out_dir={out}", "--set", "optim.epochs=2"]
    assert main([*argv, "--stop-after", "1"]) == 0
    saved = yaml.safe_load((out / "config.yaml").read_text())["threads"]
    assert saved == torch.get_num_threads()
    assert main([*argv, "--resume"]) == 0
    capsys.readouterr()
    monkeypatch.setattr(kmipgt.cpus, "available_cpus", lambda: saved + 1)  # not capped: another count
    assert main([*argv, "--resume", "--set", f"threads={saved + 1}"]) == 2
    assert "differs" in _error_line(capsys)


def test_a_failing_checkpoint_write_keeps_the_previous_checkpoint(tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    assert _train(out, "--stop-after", "1") == 0
    before = {name: (out / name).read_bytes() for name in ("last.pt", "best.pt")}
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):
        f.write(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    capsys.readouterr()
    assert _train(out, "--resume") == 1
    line = _error_line(capsys)
    assert "could not write" in line and "No space left on device" in line and "intact" in line
    assert {name: (out / name).read_bytes() for name in before} == before
    assert not list(out.glob(".*"))  # no temporary file left behind
    monkeypatch.setattr(torch, "save", real_save)
    assert _train(out, "--resume") == 0


# Dies by SIGKILL in the middle of its n-th checkpoint write, after writing a share of the bytes.
_DYING_CHILD = """
import io, os, signal, sys
import torch
from kmipgt.cli import main

die_at, share = int(sys.argv[1]), float(sys.argv[2])
real_save, calls = torch.save, [0]

def dying_save(obj, f, *args, **kwargs):
    calls[0] += 1
    if calls[0] == die_at:
        buffer = io.BytesIO()
        real_save(obj, buffer)
        f.write(buffer.getvalue()[: int(share * len(buffer.getvalue()))])
        f.flush()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_save(obj, f, *args, **kwargs)

torch.save = dying_save
sys.exit(main(sys.argv[3:]))
"""


@pytest.mark.slow  # four `kmipgt train` processes, each importing torch and PyG
def test_sigkill_during_checkpoint_writes_then_resume_equals_an_uninterrupted_run(tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "killed"
    assert _train(reference, epochs=6) == 0
    source = str(Path(kmipgt.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": source, "OMP_NUM_THREADS": "1"}
    rng = random.Random(0)
    for die_at in (rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 4), 0):
        again = "--resume" if (out / "last.pt").is_file() else "--overwrite"
        argv = ["train", "--no-progress", *BASE, "--set", f"out_dir={out}", "--set", "optim.epochs=6", again]
        child = subprocess.run(
            [sys.executable, "-c", _DYING_CHILD, str(die_at), str(rng.random()), *argv],
            env=env, capture_output=True, text=True,
        )
        assert child.returncode == (0 if die_at == 0 else -signal.SIGKILL), child.stderr
        for name in ("last.pt", "best.pt"):
            if (out / name).exists():
                load_checkpoint(out / name)  # complete, never truncated
    finished, expected = (load_checkpoint(d / "last.pt") for d in (out, reference))
    assert finished["state"]["epoch"] == 6
    for key, value in expected["model"].items():
        torch.testing.assert_close(finished["model"][key], value, atol=0, rtol=0)
    metrics = [json.loads((d / "metrics.json").read_text()) for d in (out, reference)]
    for key in ("train", "val", "test", "best_epoch", "epochs"):
        assert metrics[0][key] == metrics[1][key]


def _save_then_die(path: Path, version: int, stage: str, share: float) -> int:
    """Fork a child that writes checkpoint ``version`` and SIGKILLs itself at ``stage`` of the write:
    part-way through the bytes, before the fsync, or before the rename. Returns the child's wait status."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        try:
            real_save = torch.save

            def die(*args, **kwargs):
                os.kill(os.getpid(), signal.SIGKILL)

            def partial_save(obj, handle):
                buffer = io.BytesIO()
                real_save(obj, buffer)
                handle.write(buffer.getvalue()[: int(share * len(buffer.getvalue()))])
                handle.flush()
                die()

            if stage == "bytes":
                torch.save = partial_save
            else:
                setattr(os, stage, die)
            save_checkpoint(path, model={"w": torch.full((4096,), float(version))}, version=version)
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_twenty_sigkills_during_checkpoint_writes_leave_the_last_complete_checkpoint(tmp_path):
    path, rng = tmp_path / "last.pt", random.Random(0)
    save_checkpoint(path, model={"w": torch.zeros(4096)}, version=0)
    stages = []
    for version in range(1, 21):
        stage = rng.choice(("bytes", "fsync", "replace"))
        status = _save_then_die(path, version, stage, rng.random())
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        checkpoint = load_checkpoint(path)  # complete: the previous version, never a truncated one
        assert checkpoint["version"] == version - 1
        assert torch.equal(checkpoint["model"]["w"], torch.full((4096,), float(version - 1)))
        save_checkpoint(path, model={"w": torch.full((4096,), float(version))}, version=version)
        stages.append(stage)
    assert set(stages) == {"bytes", "fsync", "replace"}
    assert load_checkpoint(path)["version"] == 20
