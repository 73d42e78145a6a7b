"""One dataset registry: the library, ``kmipgt data`` and training resolve the same names."""

import dataclasses

import pytest
import torch
from torch_geometric.data import Data

from kmipgt.cli import main
from kmipgt.data import DATASETS, get_dataset, list_datasets, load_dataset
from kmipgt.data.city_networks import CITY_NUM_NODES
from kmipgt.data.lrgb import LRGB_NAMES
from kmipgt.lazy import resolve
from kmipgt.train import load_config
from kmipgt.train.datasets import load_raw
from kmipgt.train.validation import validate_config


def _path_graph() -> Data:
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    mask = torch.tensor([True, False, False])
    return Data(x=torch.ones(3, 2), edge_index=edge_index, y=torch.tensor([0, 1, 0]),
                train_mask=mask, val_mask=~mask, test_mask=~mask)


def _recorder(name: str, recorded: list):
    def load(**options):
        recorded.append((name, options))
        return _path_graph()

    return load


@pytest.fixture
def calls(monkeypatch):
    """Every registered loader replaced by one that records its (name, options) and returns a tiny graph."""
    recorded = []
    for name, dataset in DATASETS.items():
        monkeypatch.setitem(DATASETS, name, dataclasses.replace(dataset, loader=_recorder(name, recorded)))
    return recorded


def test_registry_lists_every_dataset():
    names = [
        "minnesota", "helsinki", "synthetic_city", "city_networks", "digits_knn", "lrgb", "synthetic_parts",
        "synthetic_rooms", "shapenet_part", "s3dis", "file", "pyg", "ogb",
    ]
    assert list_datasets() == names
    assert get_dataset("helsinki").extra == "helsinki" and get_dataset("lrgb").levels == ("graph",)


def test_every_loader_reference_resolves_and_descriptions_name_the_copies_options():
    for dataset in DATASETS.values():
        assert callable(resolve(dataset.loader)), dataset.name
    assert all(city in get_dataset("city_networks").description for city in CITY_NUM_NODES)
    assert all(name in get_dataset("lrgb").description for name in LRGB_NAMES.values())


def test_cli_and_training_resolve_the_same_names(calls, capsys):
    for name in list_datasets():
        level = get_dataset(name).levels[0]
        load_raw(load_config(None, [f"data.name={name}", f"task.level={level}", "data.options={a: 1}"]))
        assert main(["data", "info", name, "--set", "a=1"]) == 0
        assert "nodes: 3" in capsys.readouterr().out
    assert calls == [(name, {"a": 1}) for name in list_datasets() for _ in range(2)]


def test_cli_passes_its_flags_and_set_options_to_the_loader(calls, tmp_path):
    assert main(["data", "info", "city_networks", "--root", str(tmp_path), "--set", "name=paris",
                 "--set", "labels=file"]) == 0
    assert calls == [("city_networks", {"root": tmp_path, "name": "paris", "labels": "file"})]


def test_an_unknown_name_is_an_error_naming_the_registered_ones(capsys):
    with pytest.raises(ValueError, match="unknown dataset 'nope'; registered: minnesota, helsinki"):
        load_dataset("nope")
    with pytest.raises(ValueError, match="registered: minnesota"):
        load_raw(load_config(None, ["data.name=nope"]))
    with pytest.raises(ValueError, match=r"'data.name' must be one of \('minnesota'"):
        validate_config(load_config(None, ["data.name=nope"]))
    assert main(["data", "info", "nope"]) == 2
    assert "unknown dataset 'nope'; registered: minnesota" in capsys.readouterr().err


def test_options_a_loader_does_not_take_or_lacks_are_errors_naming_its_options():
    with pytest.raises(ValueError, match=r"'synthetic_city': missing a required argument: 'num_nodes'"):
        load_dataset("synthetic_city")
    with pytest.raises(ValueError, match=r"'digits_knn': got an unexpected keyword argument 'kk'.*\['k'\]"):
        load_raw(load_config(None, ["data.name=digits_knn", "data.options={kk: 3}"]))


def test_a_level_the_dataset_does_not_serve_is_an_error_before_loading(calls):
    with pytest.raises(ValueError, match=r"dataset 'lrgb' serves task.level \('graph',\), got 'node'"):
        load_raw(load_config(None, ["data.name=lrgb", "task.level=node"]))
    assert calls == []
