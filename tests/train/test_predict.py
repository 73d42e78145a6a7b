"""``kmipgt predict`` on runs over one graph: the Minnesota demo config and a synthetic city, on the run's own
splits, on new data given as a config gives it, and on a saved graph; refusals that write nothing."""

import csv
import json
import sys

import pytest
import torch

from kmipgt.cli import main
from kmipgt.data import minnesota, synthetic_city
from kmipgt.train import load_run, predict
from tiny_runs import train_tiny_city


def _rows(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _trained(root, train):
    """``train(root / "run")`` with a cache of its own under ``root`` and torch's thread count restored
    after (a run sets its own); the run folder."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("KMIPGT_CACHE", str(root / "cache"))
        threads = torch.get_num_threads()
        train(root / "run")
        torch.set_num_threads(threads)
    return root / "run"


def _train_minnesota(out):
    short = ["optim.epochs=2", "optim.warmup_epochs=0", "optim.eval_every=1", "device=cpu", f"out_dir={out}"]
    assert main(["train", "--no-progress", "--config", "minnesota",
                 *(part for override in short for part in ("--set", override))]) == 0


@pytest.fixture(scope="module")
def minnesota_run(tmp_path_factory):
    """The Minnesota demo config (the main job's model) trained for 2 epochs, on one CPU thread."""
    return _trained(tmp_path_factory.mktemp("minnesota"), _train_minnesota)


@pytest.fixture(scope="module")
def city_run(tmp_path_factory):
    """A 2-layer GPS model trained 2 epochs on a 600-node synthetic city."""
    return _trained(tmp_path_factory.mktemp("city"), train_tiny_city)


def test_test_split_accuracy_equals_kmipgt_eval(minnesota_run, tmp_path, capsys):
    out = tmp_path / "test.csv"
    assert main(["predict", str(minnesota_run), "--split", "test", "--out", str(out), "--no-progress"]) == 0
    assert capsys.readouterr().out == f"wrote {int(minnesota().test_mask.sum())} rows to {out}\n"
    assert main(["eval", str(minnesota_run)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    graph = minnesota()  # the loader's own labels and split, as independent reference
    rows = _rows(out)
    assert list(rows[0])[:4] == ["split", "graph", "node", "predicted"]
    assert [int(row["node"]) for row in rows] == graph.test_mask.nonzero().view(-1).tolist()
    assert {row["split"] for row in rows} == {"test"} and {row["graph"] for row in rows} == {"0"}
    correct = sum(int(row["predicted"]) == int(graph.y[int(row["node"])]) for row in rows)
    assert correct / len(rows) == pytest.approx(evaluated["test"], abs=1e-6)


def test_every_node_with_its_split_and_probabilities(minnesota_run, tmp_path):
    columns = predict(minnesota_run, probabilities=True)
    graph = minnesota()
    names = ["train" if a else "val" if b else "test" if c else ""
             for a, b, c in zip(graph.train_mask, graph.val_mask, graph.test_mask)]
    assert columns["split"] == names and torch.equal(columns["node"], torch.arange(graph.num_nodes))
    probabilities = columns["probabilities"]
    assert probabilities.shape == (graph.num_nodes, 10)
    torch.testing.assert_close(probabilities.sum(1), torch.ones(graph.num_nodes))
    assert torch.equal(probabilities.argmax(1), columns["predicted"])
    trainer = load_run(minnesota_run)  # the run as kmipgt eval rebuilds it
    trainer.model.eval()
    with torch.no_grad():
        reference = trainer._predict(trainer.data.graph).softmax(-1)
    torch.testing.assert_close(probabilities, reference)


@pytest.mark.requires("pyarrow")
def test_csv_parquet_and_pt_hold_the_same_rows(minnesota_run, tmp_path):
    import pyarrow.parquet as pq

    for suffix in ("csv", "parquet", "pt"):
        out = tmp_path / f"val.{suffix}"
        assert main(["predict", str(minnesota_run), "--split", "val", "--probabilities", "--out", str(out),
                     "--no-progress"]) == 0
    saved = torch.load(tmp_path / "val.pt", weights_only=True)
    table = pq.read_table(tmp_path / "val.parquet").to_pydict()
    rows = _rows(tmp_path / "val.csv")
    assert list(table) == list(rows[0]) == ["split", "graph", "node", "predicted",
                                             *(f"probability_{c}" for c in range(10))]
    assert table["node"] == saved["node"].tolist() == [int(row["node"]) for row in rows]
    assert table["predicted"] == saved["predicted"].tolist() == [int(row["predicted"]) for row in rows]
    assert table["probability_3"] == saved["probabilities"][:, 3].tolist()
    assert [float(row["probability_3"]) for row in rows] == pytest.approx(table["probability_3"], rel=1e-6)


def test_a_city_it_never_saw_given_as_a_config_or_a_saved_graph(city_run, tmp_path):
    options = "data.options={num_nodes: 300, seed: 7}"
    assert main(["predict", str(city_run), "--set", options, "--out", str(tmp_path / "new.csv"),
                 "--no-progress"]) == 0
    saved = tmp_path / "city.pt"
    assert main(["data", "synthetic", "--num-nodes", "300", "--seed", "7", "--out", str(saved)]) == 0
    assert main(["predict", str(city_run), "--graph", str(saved), "--out", str(tmp_path / "saved.csv")]) == 0
    given, read = _rows(tmp_path / "new.csv"), _rows(tmp_path / "saved.csv")
    assert [int(row["node"]) for row in given] == list(range(300))
    # Both are the same city prepared alone; the model applied to it as kmipgt eval applies it:
    trainer = load_run(city_run, overrides=[options])
    trainer.model.eval()
    with torch.no_grad():
        reference = trainer._predict(trainer.data.graph).argmax(-1).tolist()
    assert [int(row["predicted"]) for row in given] == [int(row["predicted"]) for row in read] == reference
    assert {row["split"] for row in read} == {"train", "val", "test"}  # the saved city has its masks


def test_a_graph_without_labels_or_masks_is_predicted_whole(city_run, tmp_path):
    graph = synthetic_city(120, seed=3, labels=False, progress=False)
    assert "y" not in graph and "test_mask" not in graph
    columns = predict(city_run, graph)
    assert columns["split"] == [""] * 120 and columns["predicted"].shape == (120,)
    with pytest.raises(ValueError, match="has no test nodes"):
        predict(city_run, graph, split="test")
    unlabelled = predict(city_run, {"options": {"num_nodes": 150, "seed": 4, "labels": False}})
    assert unlabelled["split"] == [""] * 150 and torch.equal(unlabelled["node"], torch.arange(150))


def test_other_feature_widths_are_one_line_exit_2_and_nothing_written(minnesota_run, tmp_path, capsys):
    saved = tmp_path / "city.pt"
    assert main(["data", "synthetic", "--num-nodes", "200", "--no-labels", "--out", str(saved)]) == 0
    out = tmp_path / "out.csv"
    code = main(["predict", str(minnesota_run), "--graph", str(saved), "--out", str(out)])
    error = capsys.readouterr().err.strip()
    assert code == 2 and len(error.splitlines()) == 1
    assert error == (f"kmipgt: error: {saved} does not fit the model of {minnesota_run}: it has 37 node "
                     "features, the model reads 4")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["city.pt"]
    code = main(["predict", str(minnesota_run), "--set", "data.name=digits_knn", "--out", str(out)])
    assert code == 2 and "dataset 'digits_knn' does not fit" in capsys.readouterr().err
    assert not out.exists()


def test_refusals_before_the_data_are_read(minnesota_run, tmp_path, capsys, monkeypatch):
    assert main(["predict", str(minnesota_run), "--out", str(tmp_path / "rows.json")]) == 2
    assert "extension picks its format" in capsys.readouterr().err
    assert main(["predict", str(minnesota_run), "--out", str(tmp_path / "no" / "rows.csv")]) == 2
    assert main(["predict", str(tmp_path), "--out", str(tmp_path / "rows.csv")]) == 2
    assert "no config.yaml" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    assert main(["predict", str(minnesota_run), "--out", str(tmp_path / "rows.parquet")]) == 2
    assert "pip install 'kmipgt[parquet]'" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_model_override_that_changes_the_weights_is_refused(minnesota_run, tmp_path, capsys):
    out = tmp_path / "rows.csv"
    assert main(["predict", str(minnesota_run), "--set", "model.channels=32", "--out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "do not fit the model this config builds: size mismatch" in error
    assert not out.exists()
