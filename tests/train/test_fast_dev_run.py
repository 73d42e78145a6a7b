"""``kmipgt train --fast-dev-run`` and ``kmipgt sweep --fast-dev-run``: a few batches of every phase of an
epoch, the loss training would see, nothing written, and a missing local copy reported by its loader."""

import csv
import re

import pytest
import torch
import yaml
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from kmipgt.cli import main
from kmipgt.configs import list_configs
from kmipgt.train import load_config
from kmipgt.train.fast_dev_run import fast_dev_run
from kmipgt.train.recipes import STARTING_RECIPES
from lrgb_copies import write_raw_peptides
from tiny_runs import TINY_DIGITS

# Shipped configs whose data are generated, at sizes that keep the suite short (the models as shipped);
# the embedded datasets (minnesota, digits_knn) run as shipped.
SHRUNK = {
    "synthetic_city": ["data.options={num_nodes: 400, seed: 0}"],
    "synthetic_city_graphgps": ["data.options={num_nodes: 400, seed: 0}"],
    "synthetic_london": ["data.options={num_nodes: 400, num_edges: 530, seed: 0}"],
    "synthetic_parts": ["data.options={num_shapes: 12, num_points: 64, k: 4}"],
    "synthetic_rooms": ["data.options={rooms_per_area: 1, num_points: 64, k: 4, val_blocks: 2}"],
}
LOCAL_COPIES = [name for name in list_configs("run") if "root" in load_config(name).data.options]
# The starting recipes train a graph of one's own (dataset ``file``, its path given with --data).
RECIPES = [name for name in list_configs("run") if load_config(name).data.name == "file"]
GENERATED_OR_EMBEDDED = [name for name in list_configs("run") if name not in LOCAL_COPIES + RECIPES]


def test_every_shipped_config_is_checked_here():
    assert set(SHRUNK) < set(GENERATED_OR_EMBEDDED)
    assert {"minnesota", "minnesota_link", "digits_knn"} == set(GENERATED_OR_EMBEDDED) - set(SHRUNK)
    copies = {"city_networks", "peptides_func", "peptides_func_gps", "peptides_func_paper", "peptides_struct",
              "peptides_struct_paper", "shapenet_part", "s3dis"}
    assert set(LOCAL_COPIES) == copies
    assert set(RECIPES) == set(STARTING_RECIPES.values())


@pytest.mark.parametrize(("level", "data"), [("node", "graph"), ("graph", "graphs"), ("edge", "graph")])
def test_a_starting_recipe_passes_on_data_of_its_level(level, data, tmp_path, capsys):
    gen = torch.Generator().manual_seed(0)
    ring = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 0]])
    graphs = [Data(x=torch.randn(5, 3, generator=gen), edge_index=to_undirected(ring),
                   y=torch.tensor([i % 2])) for i in range(10)]
    graph = Data(x=torch.randn(50, 3, generator=gen), y=torch.arange(50) % 3,
                 edge_index=to_undirected(torch.randint(0, 50, (2, 150), generator=gen)))
    torch.save(graph if data == "graph" else graphs, tmp_path / "data.pt")
    code = main(["train", "--fast-dev-run", "--data", str(tmp_path / "data.pt"), "--set",
                 f"task.level={level}", "--set", "threads=1", "--set", "device=cpu"])
    assert code == 0 and capsys.readouterr().out.splitlines()[-1].startswith("fast dev run passed: ")


def _batch_lines(text: str, phase: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(f"{phase} batch ")]


@pytest.mark.parametrize("name", GENERATED_OR_EMBEDDED)
def test_a_shipped_config_passes_and_writes_nothing(name, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    overrides = [*SHRUNK.get(name, []), "threads=1", "device=cpu", f"out_dir={work / 'run'}"]
    code = main(["train", "--fast-dev-run", "--config", name, *(p for o in overrides for p in ("--set", o))])
    out = capsys.readouterr().out
    assert code == 0 and out.splitlines()[-1].startswith("fast dev run passed: ")
    assert 1 <= len(_batch_lines(out, "train")) <= 2
    evaluated = _batch_lines(out, "evaluation") or _batch_lines(out, "val") + _batch_lines(out, "test")
    assert evaluated and all(re.search(r"loss \d+\.\d{4} over \d+ targets", line) for line in evaluated)
    assert list(work.iterdir()) == []  # no run folder, nothing else


# Without its reader a copy's loader names the extra to install before it looks at the path.
READERS = {"s3dis": ("h5py",)}


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.requires(*READERS.get(name, ()))) for name in LOCAL_COPIES]
)
def test_a_missing_local_copy_fails_with_the_loaders_error(name, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    missing = tmp_path / "nope"
    code = main(["train", "--fast-dev-run", "--config", name, "--set", f"data.options.root={missing}"])
    error = capsys.readouterr().err
    assert code == 2 and error.startswith("kmipgt: error: No ") and str(missing) in error.splitlines()[0]
    assert "Traceback" not in error and list(work.iterdir()) == []


def test_the_training_batch_is_the_first_step_of_kmipgt_train(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", "--fast-dev-run", *TINY_DIGITS]) == 0
    line = _batch_lines(capsys.readouterr().out, "train")[0]
    assert main(["train", "--no-progress", "--stop-after", "1", *TINY_DIGITS, "--set", f"out_dir={run}"]) == 0
    with open(run / "log.csv") as handle:
        first_epoch = next(csv.DictReader(handle))  # a node task steps once per epoch
    assert float(re.search(r"loss (\S+) over", line).group(1)) == pytest.approx(
        float(first_epoch["train_loss"]), abs=5e-5)


def test_n_batches_of_each_phase_of_a_set_of_graphs(tmp_path):
    write_raw_peptides(tmp_path / "lrgb", {"train": [5, 6, 7, 8, 9], "val": [4, 5, 6], "test": [7]})
    config = load_config("peptides_func", [f"data.options.root={tmp_path / 'lrgb'}", "data.batch_size=2",
                                           "model.channels=8", "model.num_layers=1", "device=cpu"])
    lines = []
    checks = fast_dev_run(config, 2, lines.append)
    assert [(c.phase, c.index) for c in checks] == [("train", 1), ("train", 2), ("val", 1), ("val", 2),
                                                    ("test", 1)]
    assert [c.shapes.get("graphs") for c in checks] == [[2], [2], [2], None, None]  # val: 2 + 1 graphs
    assert [c.shapes["x"] for c in checks[2:]] == [[9, 9], [6, 9], [7, 9]]
    assert [c.shapes["output"] for c in checks[2:]] == [[2, 10], [1, 10], [1, 10]]
    assert [line for line in lines if " batch " in line] == [check.line() for check in checks]


@pytest.mark.parametrize("name", ["peptides_func_paper", "peptides_func_gps"])
def test_the_reference_peptides_models_as_shipped_pass(name, tmp_path):
    write_raw_peptides(tmp_path / "lrgb", {"train": [5, 6, 7], "val": [4, 5], "test": [7]})
    config = load_config(name, [f"data.options.root={tmp_path / 'lrgb'}", "data.batch_size=2", "device=cpu",
                                "threads=1"])
    assert [c.phase for c in fast_dev_run(config, 1, lambda line: None)] == ["train", "val", "test"]


def test_options_that_write_are_refused(capsys):
    writing = (["--resume"], ["--overwrite"], ["--stop-after", "1"], ["--save-tokens"], ["--tensorboard"])
    for option in writing:
        assert main(["train", "--fast-dev-run", *option]) == 2
        assert f"takes no {option[0]}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:  # argparse's own error
        main(["train", "--fast-dev-run", "0"])
    assert stop.value.code == 2 and "expected an integer >= 1" in capsys.readouterr().err


def test_a_sweep_checks_every_cell_and_names_those_that_fail(tmp_path, capsys):
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"data": {"name": "digits_knn"}, "model": {"channels": 8, "num_layers": 1,
                                    "k": 4}, "device": "cpu", "threads": 1}))
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({"base": str(base), "grid": {"model.kind": ["gps", "gcn"],
                                                                  "data.options.k": [5, 0]},
                                     "out": str(tmp_path / "out")}, sort_keys=False))
    assert main(["sweep", str(sweep), "--fast-dev-run", "1"]) == 1
    out = capsys.readouterr().out
    assert "2 of 4 cells passed" in out
    failed = sorted(line.split("failed: ")[1] for line in out.splitlines() if line.startswith("  failed: "))
    assert failed == ["cell model.kind=gcn data.options.k=0", "cell model.kind=gps data.options.k=0"]
    assert out.count("fast dev run passed: 2 batches") == 2 and not (tmp_path / "out").exists()
