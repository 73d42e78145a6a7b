"""The sweep file: grid and variant expansion, cell names, overrides, checks, and the shipped sweeps."""

from pathlib import Path

import pytest
import yaml

from kmipgt.cli import main
from kmipgt.sweep import cell_overrides, check_cells, expand, format_value, load_sweep
from kmipgt.train import build_model
from kmipgt.train.config import load_config
from kmipgt.train.datasets import PreparedData
from sweep_files import TINY_CITY, variants_sweep, write_yaml

REPO = Path(__file__).parents[2]


VALUES = ["kmip", 1e-5, 0.001, 3, None, True, [0, 1], {"root": "/d", "n": [2]}, "a: b"]


@pytest.mark.parametrize("value", VALUES)
def test_format_value_reads_back_as_the_same_value(value):
    assert yaml.safe_load(format_value(value)) == value


def test_grid_expands_in_file_order_with_readable_names(tmp_path):
    base = write_yaml(tmp_path / "base.yaml", TINY_CITY)
    path = write_yaml(tmp_path / "grid.yaml", {
        "base": str(base),
        "set": {"optim.epochs": 7},
        "grid": {"model.attention": ["kmip", "none"], "model.encoder.coord_columns": [[0, 1]],
                 "seed": [0, 1, 2]},
    })
    sweep = load_sweep(path)
    assert sweep.out.as_posix() == "runs/sweeps/grid"
    cells = expand(sweep)
    assert len(cells) == 2 * 1 * 3
    assert [(c.values["model.attention"], c.values["seed"]) for c in cells] == [
        ("kmip", 0), ("kmip", 1), ("kmip", 2), ("none", 0), ("none", 1), ("none", 2)]
    assert cells[4].name == "model.attention=none__model.encoder.coord_columns=0_1__seed=1"
    assert cells[4].label == "model.attention=none model.encoder.coord_columns=[0, 1] seed=1"
    config = load_config(base, cell_overrides(sweep, cells[4]))
    m = config.model
    assert (m.attention.kind, m.encoder.coord_columns, config.seed) == ("none", [0, 1], 1)
    assert config.optim.epochs == 7 and config.out_dir == "runs/sweeps/grid/cells/" + cells[4].name
    assert load_sweep(path, out=tmp_path / "elsewhere").out == tmp_path / "elsewhere"


def test_variants_are_a_first_axis_of_keys_set_together(tmp_path):
    base, path = variants_sweep(tmp_path)
    sweep = load_sweep(path)
    cells = expand(sweep)
    assert [c.name for c in cells] == [
        "variant=kmip__seed=0", "variant=kmip__seed=1", "variant=wide__seed=0", "variant=wide__seed=1"]
    configs = [load_config(base, cell_overrides(sweep, cell)) for cell in cells]
    assert [(c.model.attention.kind, c.model.channels, c.seed) for c in configs] == [
        ("kmip", 8, 0), ("kmip", 8, 1), ("none", 12, 0), ("none", 12, 1)]
    assert all(c.optim.epochs == 7 for c in configs)


def test_command_line_overrides_join_the_files_set(tmp_path):
    base = write_yaml(tmp_path / "base.yaml", TINY_CITY)
    path = write_yaml(tmp_path / "s.yaml", {
        "base": str(base), "set": {"optim.epochs": 7, "optim.lr": 0.01}, "grid": {"seed": [0]}})
    sweep = load_sweep(path, overrides=["optim.epochs=3", "model.encoder.coord_columns=[0, 1]"])
    assert sweep.fixed == {"optim.epochs": 3, "optim.lr": 0.01, "model.encoder.coord_columns": [0, 1]}
    config = load_config(base, cell_overrides(sweep, expand(sweep)[0]))
    assert (config.optim.epochs, config.optim.lr, config.model.encoder.coord_columns) == (3, 0.01, [0, 1])
    with pytest.raises(ValueError, match="both fixed"):
        load_sweep(path, overrides=["seed=4"])
    with pytest.raises(ValueError, match=r"key\.sub=value"):
        load_sweep(path, overrides=["optim.epochs"])
    with pytest.raises(ValueError, match="--set must not set out_dir"):
        load_sweep(path, overrides=["out_dir=x"])


@pytest.mark.parametrize(("content", "message"), [
    ({"base": "b.yaml", "variants": {"a": {"seed": 1}}, "grid": {"seed": [0]}}, "variant 'a' sets keys"),
    ({"base": "b.yaml", "variants": {"a": {"seed": 1}}, "set": {"seed": 0}}, "variant 'a' sets keys"),
    ({"base": "b.yaml", "variants": {"a": {}}, "grid": {"variant": [0]}}, "axis of 'variants'"),
    ({"base": "b.yaml", "variants": [{"seed": 1}]}, "non-empty mapping of names"),
    ({"base": "b.yaml", "variants": {"a": {"out_dir": "x"}}}, "must not set out_dir"),
    ({"grid": {"seed": [0]}}, "needs a base config"),
    ({"base": "b.yaml", "grid": {"seed": []}}, "non-empty list"),
    ({"base": "b.yaml", "grid": {"seed": [0]}, "runs": 3}, "unknown sweep keys"),
    ({"base": "b.yaml", "set": {"out_dir": "x"}}, "must not set out_dir"),
    ({"base": "b.yaml", "set": ["optim.epochs=3"]}, "set must be a mapping"),
    ({"base": "b.yaml", "set": {"seed": 1}, "grid": {"seed": [0]}}, "both fixed"),
])
def test_bad_sweep_files_are_errors(tmp_path, content, message):
    with pytest.raises(ValueError, match=message):
        load_sweep(write_yaml(tmp_path / "s.yaml", content))


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "sweeps").glob("*.yaml")), ids=lambda p: p.stem)
def test_shipped_sweeps_expand_into_configs_that_build(path, monkeypatch):
    monkeypatch.chdir(REPO)  # sweep paths are relative to the working directory
    sweep = load_sweep(path)
    assert sweep.out.as_posix() == f"runs/sweeps/{path.stem}"
    for cell in expand(sweep):
        config = load_config(sweep.base, cell_overrides(sweep, cell))
        data = PreparedData(config.task.level, None, None, in_channels=40, edge_channels=1, out_channels=10,
                            name=config.data.name)
        build_model(config, data)


def test_a_bad_value_in_one_cell_is_reported_before_any_cell_runs(tmp_path, capsys):
    base = write_yaml(tmp_path / "base.yaml", TINY_CITY)
    path = write_yaml(tmp_path / "s.yaml", {"base": str(base), "out": str(tmp_path / "out"),
                                            "grid": {"model.attention.k": [4, 0], "seed": [0]}})
    sweep = load_sweep(path)
    check_cells(sweep, expand(sweep)[:1])
    message = r"^cell model.attention.k=0 seed=0: config key 'model.attention.k' must be >= 1, got 0$"
    with pytest.raises(ValueError, match=message):
        check_cells(sweep, expand(sweep))
    assert main(["sweep", str(path)]) == 2
    assert "cell model.attention.k=0 seed=0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
