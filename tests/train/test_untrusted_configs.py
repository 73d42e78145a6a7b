"""Configs, sweep files and run folders from elsewhere: YAML aliases refused, long values shortened in
messages, thread and worker counts capped at the CPUs this process may use."""

import logging
import os

import pytest
import torch
import yaml

from kmipgt.cli import main
from tiny_runs import TINY_DIGITS

TINY = [*TINY_DIGITS, "--set", "optim.epochs=1"]


def _laughs(levels=9):
    """A few hundred bytes of YAML whose nested aliases expand to 9**levels strings."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _error(capsys):
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    return err.strip()


def test_the_alias_file_is_small(tmp_path):
    assert len(_laughs()) < 600
    # what the aliases are: nine copies of the level below
    assert yaml.safe_load(_laughs(2))["a1"] == [["lol"] * 9] * 9


@pytest.mark.parametrize(("file", "argv"), [
    ("laughs.yaml", lambda path: ["train", "--config", str(path)]),
    ("laughs.yaml", lambda path: ["sweep", str(path), "--dry-run"]),
    ("config.yaml", lambda path: ["eval", str(path.parent)]),  # a run folder from elsewhere
])
def test_yaml_aliases_are_refused_in_one_line(tmp_path, capsys, file, argv):
    path = tmp_path / file
    path.write_text(_laughs())
    (tmp_path / "best.pt").write_bytes(b"")
    assert main(argv(path)) == 2
    assert _error(capsys).startswith(f"kmipgt: error: {path} is not valid YAML: found the alias *a0 "
                                     "(aliases are not read)")


def test_an_alias_in_a_command_line_value_is_refused(capsys):
    assert main(["train", *TINY, "--set", "model.encoder.coord_columns=[&a 1, *a]"]) == 2
    assert "found the alias *a (aliases are not read)" in _error(capsys)


def test_long_values_are_shortened_in_messages(tmp_path, capsys):
    path = tmp_path / "long.yaml"
    long_values = {"kind": "x" * 100_000, "k": list(range(100_000))}
    path.write_text(yaml.safe_dump({"model": {"attention": long_values}}))
    assert main(["train", "--config", str(path)]) == 2
    line = _error(capsys)
    expected = "kmipgt: error: config key 'model.attention.k' expects int, got [0, 1, 2, 3, 4, 5, ...]"
    assert line.startswith(expected)
    path.write_text(yaml.safe_dump({"model": {"attention": "x" * 100_000}}))
    assert main(["train", "--config", str(path)]) == 2
    line = _error(capsys)
    assert "config key 'model.attention.kind' must be one of" in line and len(line) < 400


def test_threads_are_capped_at_the_cpus_this_process_may_use(tmp_path, capsys, caplog):
    cpus = len(os.sched_getaffinity(0))
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="kmipgt"):
        assert main(["train", "--no-progress", *TINY, "--set", f"out_dir={out}", "--set", "threads=300"]) == 0
    notes = [record.getMessage() for record in caplog.records]
    assert notes == [f"threads: 300 is more than the {cpus} CPUs this process may use; using {cpus}"]
    assert torch.get_num_threads() == cpus
    # A run folder from elsewhere asking for more: evaluated with the same cap.
    torch.set_num_threads(1)
    assert yaml.safe_load((out / "config.yaml").read_text())["threads"] == 300
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kmipgt"):
        assert main(["eval", str(out)]) == 0
    assert torch.get_num_threads() == cpus and len(caplog.records) == 1
