"""A ``kmipgt train`` stopped early (Ctrl-C or ``--stop-after``) says in one line how to continue, and the
command it prints continues the run."""

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kmipgt.cli
import kmipgt.train
from kmipgt.cli import main

SRC = Path(kmipgt.cli.__file__).parents[2]
# Minnesota with a one-layer, 4-channel model: about a second per epoch on one thread.
TINY = ["--no-progress", *("--set", "model.channels=4", "--set", "model.num_layers=1"),
        *("--set", "threads=1", "--set", "device=cpu", "--set", "optim.warmup_epochs=0")]


def _continue(command: str, epoch: int) -> list[str]:
    """The printed command as ``main``'s argv, stopping after ``epoch`` so the test ends."""
    words = shlex.split(command)
    assert words[:2] == ["kmipgt", "train"] and "--resume" in words
    return [*words[1:], "--no-progress", "--stop-after", str(epoch)]


@pytest.mark.slow  # a child process that imports torch and trains an epoch: about 12 s on 2 cores
def test_ctrl_c_prints_the_epoch_and_the_resume_command(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--set", f"out_dir={out}", "--set", "optim.epochs=1000"]
    child = subprocess.Popen(
        [sys.executable, "-m", "kmipgt", *argv], env={**os.environ, "PYTHONPATH": str(SRC)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A shell starts background jobs with SIGINT ignored, which the child would inherit.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        while not (out / "log.csv").is_file() and child.poll() is None:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 130, err
    (line,) = err.splitlines()
    prefix, _, command = line.partition("; continue with: ")
    assert prefix.startswith("kmipgt: interrupted in epoch ")
    saved = int(prefix.rsplit("last.pt keeps epoch ", 1)[1].rstrip(")"))
    assert saved >= 1 and prefix.startswith(f"kmipgt: interrupted in epoch {saved + 1} of 1000 ")

    assert main(_continue(command, saved + 1)) == 0
    assert f"stopped after epoch {saved + 1} of 1000; continue with: {command}" in capsys.readouterr().out
    assert len((out / "log.csv").read_text().splitlines()) == 1 + saved + 1


def test_stop_after_prints_the_resume_command(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", *TINY, "--set", f"out_dir={out}", "--set", "optim.epochs=3", "--stop-after", "1"]
    assert main(argv) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    expected = f"kmipgt train --config {out / 'config.yaml'} --resume"
    assert last == f"stopped after epoch 1 of 3; continue with: {expected}"
    assert main([*shlex.split(expected)[1:], "--no-progress"]) == 0
    assert "test accuracy:" in capsys.readouterr().out


def test_ctrl_c_before_an_epoch_is_saved_says_there_is_nothing_to_resume(tmp_path, capsys, monkeypatch):
    def interrupted(config, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(kmipgt.train, "train", interrupted)
    assert main(["train", "--set", f"out_dir={tmp_path}"]) == 130
    assert capsys.readouterr().err == (
        "kmipgt: interrupted before an epoch was saved: nothing to resume; start again with --overwrite\n")
