"""``kmipgt predict`` on runs over sets of graphs (synthetic part segmentation, a planted Peptides-func copy)
and on a link-prediction run: rows batch by batch, checked against what ``kmipgt eval`` computes."""

import csv
import json

import pytest
import torch
from torch_geometric.data import Data

from kmipgt.cli import main
from kmipgt.data import synthetic_parts
from kmipgt.train import load_run, predict
from kmipgt.train.predictions import Predictions
from lrgb_copies import write_raw_peptides

PARTS = "data.options={num_shapes: 12, num_points: 64, k: 4}"
SMALL = ["model.num_layers=1", "model.channels=16", "optim.epochs=2", "optim.warmup_epochs=0",
         "optim.eval_every=1", "threads=1", "device=cpu"]


def _train(out, config, *overrides):
    threads = torch.get_num_threads()
    arguments = [part for override in (*SMALL, *overrides, f"out_dir={out}") for part in ("--set", override)]
    assert main(["train", "--no-progress", "--config", config, *arguments]) == 0
    torch.set_num_threads(threads)
    return out


def _evaluated_outputs(run, split="test"):
    """``(output, target)`` of ``split`` as ``kmipgt eval`` computes them (the task's own batches)."""
    trainer = load_run(run)
    trainer.model.eval()
    with torch.no_grad():
        _, output, target = next(trainer.task.split_outputs(trainer._predict, (split,), trainer.device))
    return output, target


def test_segmentation_rows_per_point_and_the_accuracy_of_kmipgt_eval(tmp_path, capsys):
    run = _train(tmp_path / "run", "synthetic_parts", PARTS, "data.batch_size=2")
    out = tmp_path / "test.csv"
    assert main(["predict", str(run), "--split", "test", "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    accuracy = json.loads(capsys.readouterr().out)["report"]["accuracy"]["test"]
    test = synthetic_parts(num_shapes=12, num_points=64, k=4)["test"]  # the loader's shapes, as reference
    with open(out, newline="") as handle:
        rows = list(csv.DictReader(handle))
    ids = [(int(row["graph"]), int(row["node"])) for row in rows]
    assert ids == [(graph, node) for graph in range(len(test)) for node in range(64)]
    labels = torch.cat([shape.y for shape in test])
    predicted = torch.tensor([int(row["predicted"]) for row in rows])
    assert float((predicted == labels).double().mean()) == pytest.approx(accuracy, abs=1e-6)
    chunks = list(Predictions(run, split="test").chunks())
    assert [len(chunk["split"]) for chunk in chunks] == [128] * (len(test) // 2) + [64] * (len(test) % 2)


@pytest.fixture(scope="module")
def peptides(tmp_path_factory):
    """A planted Peptides-func copy and a 1-layer GPS run on it (batches of 2 molecules)."""
    root = tmp_path_factory.mktemp("peptides")
    graphs = write_raw_peptides(root / "lrgb", {"train": [5, 9, 4, 7, 6, 8], "val": [6, 8, 5, 7],
                                                "test": [3, 4, 5, 6, 7]})
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KMIPGT_CACHE", str(root / "cache"))
        run = _train(root / "run", "peptides_func", f"data.options.root={root / 'lrgb'}", "data.batch_size=2")
    return run, graphs


def test_graph_level_targets_and_probabilities_are_those_of_kmipgt_eval(peptides):
    run, _ = peptides
    columns = predict(run, split="test", probabilities=True)
    output, _ = _evaluated_outputs(run)
    assert columns["split"] == ["test"] * 5 and torch.equal(columns["graph"], torch.arange(5))
    torch.testing.assert_close(columns["probabilities"], torch.sigmoid(output))
    assert torch.equal(columns["predicted"], (torch.sigmoid(output) > 0.5).long())
    assert columns["predicted"].shape == (5, 10)


def test_a_saved_molecule_is_prepared_with_the_training_statistics(peptides, tmp_path):
    run, graphs = peptides
    x, edge_attr, edge_index, _ = graphs["test"][2]
    path = tmp_path / "molecule.pt"
    torch.save(Data(x=x, edge_attr=edge_attr, edge_index=edge_index), path)  # no label
    alone = predict(run, path, probabilities=True)
    within = predict(run, split="test", probabilities=True)
    assert alone["split"] == [""] and alone["graph"].tolist() == [0]
    torch.testing.assert_close(alone["probabilities"][0], within["probabilities"][2])
    with pytest.raises(ValueError, match="one graph in no split"):
        predict(run, path, split="test")


def test_a_saved_molecule_of_other_atom_ids_or_columns_is_refused(peptides, tmp_path):
    run, graphs = peptides
    x, edge_attr, edge_index, _ = graphs["test"][2]
    path = tmp_path / "molecule.pt"
    beyond = x.clone()
    beyond[0, 0] = 119  # OGB's table of atomic numbers has 119 rows
    torch.save(Data(x=beyond, edge_attr=edge_attr, edge_index=edge_index), path)
    with pytest.raises(ValueError, match=r"x: column 0 must hold category ids in \[0, 119\)"):
        predict(run, path)
    torch.save(Data(x=x[:, :8], edge_attr=edge_attr, edge_index=edge_index), path)
    with pytest.raises(ValueError, match=r"x must have shape \[R, 9\]"):
        predict(run, path)


def test_a_link_run_scores_the_pairs_kmipgt_eval_scores(tmp_path):
    run = _train(tmp_path / "run", "minnesota_link")
    columns = predict(run, split="test", probabilities=True)
    trainer = load_run(run)
    pairs = trainer.data.splits["test"][0].edge_label_index
    assert torch.equal(torch.stack([columns["source"], columns["target"]]), pairs)
    output, _ = _evaluated_outputs(run)
    torch.testing.assert_close(columns["probabilities"], torch.sigmoid(output).view(-1))
    splits = predict(run)["split"]
    sizes = [trainer.data.splits[split][0].edge_label_index.size(1) for split in ("train", "val", "test")]
    assert splits == ["train"] * sizes[0] + ["val"] * sizes[1] + ["test"] * sizes[2]
