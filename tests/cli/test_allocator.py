"""The ``kmipgt`` command applies a config's ``allocator`` once the config is loaded, before the data."""

import pytest

import kmipgt.cli
import kmipgt.cli.runs
import kmipgt.train
from kmipgt.cli import main


@pytest.fixture
def events(monkeypatch):
    """What the command did, in order: allocator policies applied and the library calls that build data."""
    seen = []
    monkeypatch.setattr(kmipgt.cli.runs, "use_allocator", lambda policy: seen.append(("allocator", policy)))
    monkeypatch.setattr(kmipgt.cli, "retain_freed_memory", lambda: seen.append(("allocator", "retain*")))
    monkeypatch.setattr(kmipgt.train, "train", lambda config, **kwargs: seen.append(("train",)) or {})
    monkeypatch.setattr(kmipgt.train, "evaluate_run", lambda *args, **kwargs: seen.append(("eval",)) or {})
    return seen


@pytest.mark.parametrize(("settings", "policy"), [([], "retain"), (["--set", "allocator=live"], "live")])
def test_train_applies_the_configs_allocator_before_training(events, settings, policy):
    assert main(["train", *settings]) == 0
    assert events == [("allocator", policy), ("train",)]


def test_the_london_config_needs_no_environment_variable(events):
    assert main(["train", "--config", "synthetic_london"]) == 0
    assert events == [("allocator", "system"), ("train",)]


def test_eval_applies_the_saved_runs_allocator_with_overrides(events, tmp_path):
    (tmp_path / "config.yaml").write_text("allocator: system\n")
    assert main(["eval", str(tmp_path)]) == 0
    assert main(["eval", str(tmp_path), "--set", "allocator=live"]) == 0
    assert events == [("allocator", "system"), ("eval",), ("allocator", "live"), ("eval",)]


def test_commands_without_a_config_keep_freed_memory(events, capsys):
    assert main(["configs"]) == 0
    assert events == [("allocator", "retain*")]


def test_an_unknown_allocator_is_a_usage_error(capsys):
    assert main(["train", "--set", "allocator=jemalloc"]) == 2
    assert "config key 'allocator' must be one of" in capsys.readouterr().err
