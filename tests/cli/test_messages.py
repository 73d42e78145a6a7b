"""What ``kmipgt`` tells a newcomer: the default job, config errors in one plain line before torch is
imported, the shipped configs grouped, a real ``--help``."""

import subprocess
import sys
from pathlib import Path

import pytest

import kmipgt.cli
import kmipgt.configs
import kmipgt.train
from kmipgt.cli import main
from kmipgt.configs import first_comment, list_configs
from kmipgt.train import load_config

SRC = Path(kmipgt.cli.__file__).parents[2]


@pytest.fixture
def trained(monkeypatch):
    """The configs ``kmipgt train`` would train, in order (nothing is trained)."""
    configs = []
    monkeypatch.setattr(kmipgt.train, "train", lambda config, **kwargs: configs.append(config) or {
        "complete": True, "metric": "accuracy", "test": 0.0})
    return configs


def test_train_without_a_config_is_the_main_job(trained, capsys):
    assert main(["train"]) == 0
    assert main(["train", "--config", "minnesota"]) == 0
    assert main(["train", "--config", "configs/minnesota.yaml"]) == 0  # what `make demo` runs
    assert trained[0] == trained[1] == trained[2] == load_config("minnesota")


def test_an_unknown_key_names_the_closest_one(capsys):
    assert main(["train", "--set", "model.attention.kk=3"]) == 2
    err = capsys.readouterr().err
    assert err == "kmipgt: error: unknown config keys in 'model.attention': 'kk' (did you mean 'k'?)\n"


def test_a_key_with_no_close_match_lists_the_known_keys():
    with pytest.raises(ValueError, match=r"'zzz'; known: .*\bk\b"):
        load_config(None, ["model.attention.zzz=1"])


@pytest.mark.parametrize(("override", "expected"), [
    ("model.attention.k=1.5", "expects int, got 1.5"),
    ("model.attention.head_dim=x", "expects int | None, got 'x'"),
    ("model.encoder.coord_columns=3", "expects list[int], got 3"),
])
def test_type_errors_name_types_as_they_are_written(capsys, override, expected):
    assert main(["train", "--set", override]) == 2
    err = capsys.readouterr().err
    assert expected in err and "<class" not in err


def test_a_sweep_given_to_train_names_kmipgt_sweep(capsys):
    assert main(["train", "--config", "sweeps/influence_of_k"]) == 2
    assert capsys.readouterr().err == (
        "kmipgt: error: sweeps/influence_of_k is a sweep, not a run config: run "
        "`kmipgt sweep sweeps/influence_of_k`\n"
    )


def _in_a_fresh_interpreter(code: str) -> subprocess.CompletedProcess:
    """Run ``code``, then fail unless torch is still not imported."""
    check = "; import sys; assert 'torch' not in sys.modules, 'torch imported'"
    return subprocess.run([sys.executable, "-c", code + check], env={"PYTHONPATH": str(SRC)},
                          capture_output=True, text=True)


@pytest.mark.parametrize(("override", "message"), [
    ("model.attention.kk=3", "did you mean 'k'?"),
    ("model.attention=foo", "config key 'model.attention.kind' must be one of ('kmip', 'full', 'performer'"),
    ("model.local=foo", "config key 'model.local' must be one of ('gatedgcn', 'gine'"),
    ("data.name=foo", "config key 'data.name' must be one of ('minnesota', 'helsinki'"),
    ("model.kind=foo", "config key 'model.kind' must be one of ('gps', 'mlp'"),
    ("model.norm_position=foo", "config key 'model.norm_position' must be one of ('post', 'pre')"),
    ("model.attention.k=0", "config key 'model.attention.k' must be >= 1, got 0"),
    ("task.metric=foo", "config key 'task.metric' must be one of ('accuracy'"),
    ("distributed.strategy=foo", "config key 'distributed.strategy' must be one of ('none', 'ddp', 'graph')"),
])
def test_a_config_error_comes_before_torch_is_imported(override, message):
    done = _in_a_fresh_interpreter(
        f"from kmipgt.cli import main; assert main(['train', '--set', {override!r}]) == 2"
    )
    assert done.returncode == 0, done.stderr
    assert message in done.stderr


@pytest.mark.parametrize("command", [
    ["bench", "step", "--config", "peptides_func"],
    ["bench", "memory", "--config", "minnesota"],
    ["analysis", "probe", "--config", "minnesota"],
    ["eval", "RUN"],
    ["sweep", "sweeps/influence_of_k"],
])
def test_every_command_that_reads_a_config_reports_its_errors_before_torch(command, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(kmipgt.configs.config_path("minnesota").read_text())
    command = [str(run) if word == "RUN" else word for word in command]
    done = _in_a_fresh_interpreter(
        f"from kmipgt.cli import main; assert main({[*command, '--set', 'model.attention.heads=0']!r}) == 2"
    )
    assert done.returncode == 0, done.stderr
    assert "config key 'model.attention.heads' must be >= 1, got 0" in done.stderr


def test_checking_a_good_config_imports_no_torch():
    done = _in_a_fresh_interpreter(
        "from kmipgt.cli.runs import load_config; load_config('peptides_func', ['device=cuda:1'])"
    )
    assert done.returncode == 0, done.stderr


def test_configs_lists_run_configs_then_sweeps_with_their_first_comment_line(capsys):
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    runs, sweeps = out.split("\n\n")
    run_lines, sweep_lines = runs.splitlines(), sweeps.splitlines()
    assert run_lines[0].startswith("run configs") and sweep_lines[0].startswith("sweeps")
    assert [line.split()[0] for line in run_lines[1:]] == list_configs("run")
    assert [line.split()[0] for line in sweep_lines[1:]] == list_configs("sweep")
    assert sorted(list_configs("run") + list_configs("sweep")) == list_configs()
    assert all(not name.startswith("sweeps/") for name in list_configs("run"))
    minnesota = next(line for line in run_lines if line.split()[0] == "minnesota")
    assert minnesota.split(None, 1)[1] == first_comment("minnesota")
    assert first_comment("minnesota").startswith("The main job")


def test_a_missing_config_lists_the_run_configs_only():
    with pytest.raises(FileNotFoundError, match=r"shipped run configs: .*minnesota") as error:
        load_config("no_such_config")
    assert "sweeps/" not in str(error.value)


def test_help_says_what_kmipgt_is_and_its_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "k-MIP attention" in out and "parse, call the library" not in out
    for command in ("train", "eval", "sweep", "configs", "data", "analysis", "bench"):
        assert f"kmipgt {command}" in out



@pytest.mark.parametrize(("raised", "code", "err"), [
    (ValueError("no copy under /data. Looked for:\n  /data/x.pt"), 2,
     "kmipgt: error: no copy under /data. Looked for:\n  /data/x.pt\n"),
    (RuntimeError("the compiler failed:\nline 1\nline 2"), 1, "kmipgt: error: the compiler failed:\n"),
    (KeyboardInterrupt(), 130, "kmipgt: interrupted\n"),
    (KeyboardInterrupt("interrupted in epoch 3"), 130, "kmipgt: interrupted in epoch 3\n"),
])
def test_every_error_of_a_command_is_printed_by_main(monkeypatch, capsys, raised, code, err):
    """Bad input: its whole message, exit 2; anything else: its first line, exit 1; Ctrl-C: 130."""

    def fail(*args):
        raise raised

    monkeypatch.setattr(kmipgt.configs, "list_configs", fail)
    assert main(["configs"]) == code
    assert capsys.readouterr().err == err
