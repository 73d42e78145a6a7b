"""Shipped configs are found by name from any directory; an existing path always wins."""

from pathlib import Path

import pytest

import kmipgt.configs
from kmipgt.cli import main
from kmipgt.configs import config_path, list_configs
from kmipgt.sweep import load_sweep
from kmipgt.train import load_config

SHIPPED = Path(kmipgt.configs.__file__).parent


def test_every_shipped_yaml_is_listed_by_name():
    on_disk = {p.relative_to(SHIPPED).with_suffix("").as_posix() for p in SHIPPED.rglob("*.yaml")}
    assert set(list_configs()) == on_disk
    assert {"minnesota", "synthetic_city", "sweeps/influence_of_k"} <= on_disk


@pytest.mark.parametrize("name", ["minnesota", "minnesota.yaml", "configs/minnesota.yaml"])
def test_names_resolve_to_the_shipped_file_from_an_empty_directory(tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    assert config_path(name) == SHIPPED / "minnesota.yaml"
    assert load_config(name).data.name == "minnesota"


def test_a_local_file_wins_over_the_shipped_one(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minnesota.yaml").write_text("model: {k: 3}\n")
    assert config_path("minnesota.yaml") == Path("minnesota.yaml")
    assert load_config("minnesota.yaml").model.attention.k == 3


def test_unknown_name_lists_the_shipped_configs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"shipped run configs: .*minnesota"):
        load_config("no_such_config")


def test_a_shipped_sweep_and_its_base_resolve_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = load_sweep("sweeps/influence_of_k_minnesota")
    assert sweep.base == SHIPPED / "minnesota.yaml"


def test_configs_command_lists_paths(capsys):
    assert main(["configs", "--paths"]) == 0
    assert all(Path(line).is_file() for line in capsys.readouterr().out.split())


def test_version_flag_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"kmipgt {kmipgt.__version__}"
