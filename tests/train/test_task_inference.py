"""The task read from the data where the config leaves it open, every metric with the losses it scores, data
in Python trained with ``kmipgt.train.fit``, datasets registered in code or by installed packages, and a
dataset's own evaluator (OGB's) as the metric."""

import json
import sys
import types
from importlib import metadata

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score
from torch_geometric.data import Data
from torch_geometric.datasets import KarateClub

from kmipgt.cli import main
from kmipgt.data import DATASETS, get_dataset, list_datasets, register_dataset
from kmipgt.data.registry import Dataset
from kmipgt.train import fit, load_config
from kmipgt.train.config import TaskConfig
from kmipgt.train.metrics import compute_metric
from kmipgt.train.task_inference import labels_task, resolve_task
from kmipgt.train.validation import validate_config


def _sets(items: list[str]) -> list[str]:
    return [part for item in items for part in ("--set", item)]


FAST = ["optim.epochs=2", "optim.warmup_epochs=1", "optim.eval_every=1", "model.channels=8",
        "model.num_layers=1", "model.attention.k=4", "threads=1", "device=cpu"]


@pytest.mark.parametrize(("labels", "expected"), [
    (torch.tensor([0, 1, 1, 0]), ("cross_entropy", "roc_auc")),
    (torch.tensor([[0], [1], [1]]), ("cross_entropy", "roc_auc")),  # class ids in a column, as OGB's
    (torch.tensor([0, 4, 2, 1]), ("cross_entropy", "accuracy")),
    (torch.tensor([[0, 1, 1], [1, 0, 0.0]]), ("bce", "ap")),
    (torch.tensor([0.0, 1.0, 1.0]), ("bce", "roc_auc")),
    (torch.tensor([0.5, 2.25, -1.0]), ("l1", "mae")),
])
def test_the_loss_and_metric_follow_the_labels(labels, expected):
    assert labels_task(labels)[:2] == expected


def test_what_the_config_sets_wins_and_the_metric_follows_a_chosen_loss():
    graphs = {"train": [Data(x=torch.ones(3, 1), edge_index=torch.zeros(2, 0, dtype=torch.long),
                             y=torch.tensor([1]))]}
    labels = lambda level: torch.tensor([0, 1, 2])  # noqa: E731
    assert resolve_task(TaskConfig(), graphs, labels) == TaskConfig("graph", "cross_entropy", "accuracy")
    assert resolve_task(TaskConfig(loss="l1"), graphs, labels).metric == "mae"
    assert resolve_task(TaskConfig(metric="macro_f1"), graphs, labels).metric == "macro_f1"
    assert resolve_task(TaskConfig(level="edge"), graphs, labels) == TaskConfig("edge", "bce", "roc_auc")


@pytest.mark.parametrize(("loss", "metric"), [("l1", "accuracy"), ("cross_entropy", "mae"), ("bce", "miou")])
def test_a_metric_that_does_not_score_the_loss_is_refused_before_any_data(loss, metric, capsys):
    with pytest.raises(ValueError, match=f"'{metric}' does not score task.loss '{loss}'"):
        validate_config(load_config(None, [f"task.loss={loss}", f"task.metric={metric}"]))
    assert main(["train", "--set", f"task.loss={loss}", "--set", f"task.metric={metric}"]) == 2


def test_roc_auc_and_ap_of_a_cross_entropy_model_score_its_classes_probabilities():
    gen = torch.Generator().manual_seed(0)
    logits, target = torch.randn(40, 2, generator=gen), torch.randint(0, 2, (40,), generator=gen)
    positive = logits.softmax(-1)[:, 1].numpy()
    assert compute_metric("roc_auc", logits, target) == pytest.approx(roc_auc_score(target, positive))
    assert compute_metric("ap", logits, target) == pytest.approx(average_precision_score(target, positive))
    logits, target = torch.randn(60, 3, generator=gen), torch.arange(60) % 3
    each = [roc_auc_score(target == c, logits.softmax(-1)[:, c]) for c in range(3)]  # one against the rest
    assert compute_metric("roc_auc", logits, target) == pytest.approx(float(np.mean(each)))
    binary = torch.tensor([[2.0], [-1.0], [0.5], [-3.0]])
    assert compute_metric("accuracy", binary, torch.tensor([[1.0], [0.0], [0.0], [0.0]])) == 0.75


def _small_graph() -> Data:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(40, 3, generator=gen)
    return Data(x=x, edge_index=torch.randint(0, 40, (2, 120), generator=gen), y=(x[:, 0] > 0).long())


def test_fit_trains_data_in_python_and_leaves_a_run_that_predicts(tmp_path):
    trainer = fit(_small_graph(), overrides=FAST, out_dir=tmp_path / "run", progress=False)
    assert trainer.config.task == TaskConfig("node", "cross_entropy", "roc_auc")
    assert trainer.metrics["complete"] and set(trainer.metrics) >= {"train", "val", "test"}
    masks = [int(trainer.data.graph[f"{split}_mask"].sum()) for split in ("train", "val", "test")]
    assert masks == [32, 4, 4]  # no masks: a seeded 80/10/10 split of the labelled nodes
    assert main(["predict", str(tmp_path / "run"), "--out", str(tmp_path / "rows.csv")]) == 0
    karate = fit(KarateClub(), overrides=FAST, out_dir=tmp_path / "karate", progress=False)
    # KarateClub marks four training nodes: the others are split into validation and test.
    assert [int(karate.data.graph[f"{s}_mask"].sum()) for s in ("train", "val", "test")] == [4, 15, 15]
    ring = torch.tensor([[0, 1, 2], [1, 2, 3]])
    graphs = [Data(x=torch.randn(5, 2), edge_index=ring, y=torch.tensor([i % 2])) for i in range(20)]
    level = fit(graphs, overrides=FAST, out_dir=tmp_path / "graphs", progress=False)
    assert level.config.task.level == "graph" and [len(level.data.splits[s]) for s in ("train", "val",
                                                                                       "test")] == [16, 2, 2]


def test_a_dataset_registered_in_code_trains_by_name(tmp_path, monkeypatch):
    monkeypatch.setattr("kmipgt.data.registry.DATASETS", dict(DATASETS))
    register_dataset("mine", lambda size=40: _small_graph(), levels=("node",), description="a test graph")
    with pytest.raises(ValueError, match="registered already"):
        register_dataset("mine", _small_graph)
    assert "mine" in list_datasets()
    args = ["train", "--config", "start_node", *_sets(["data.name=mine", f"out_dir={tmp_path / 'r'}", *FAST]),
            "--no-progress"]
    assert main(args) == 0
    assert json.loads((tmp_path / "r" / "metrics.json").read_text())["dataset"] == "mine"


def test_an_installed_packages_dataset_is_listed_and_loaded(tmp_path, monkeypatch, capsys):
    module = types.ModuleType("their_package")
    module.DATASET = Dataset("theirs", lambda: _small_graph(), ("node",), "a package's graph")
    monkeypatch.setitem(sys.modules, "their_package", module)
    point = metadata.EntryPoint("theirs", "their_package:DATASET", "kmipgt.datasets")
    monkeypatch.setattr(metadata, "entry_points", lambda group: [point] if group == "kmipgt.datasets" else [])
    monkeypatch.setattr("kmipgt.data.registry.DATASETS", dict(DATASETS))
    assert "theirs" in list_datasets() and get_dataset("theirs") is module.DATASET
    monkeypatch.setattr("kmipgt.data.registry.DATASETS", dict(DATASETS))
    assert main(["configs"]) == 0
    assert "datasets of installed packages (data.name): theirs" in capsys.readouterr().out
    assert main(["data", "list"]) == 0
    assert "theirs" in capsys.readouterr().out


@pytest.mark.requires("ogb")
def test_an_ogb_dataset_is_scored_by_its_official_evaluator(tmp_path):
    from ogb.graphproppred import Evaluator

    from pyg_copies import write_ogbg_molhiv

    write_ogbg_molhiv(tmp_path / "ogb", sizes=(3, 5, 4, 6, 3, 4, 5, 2) * 5)
    run = tmp_path / "run"
    args = ["train", "--config", "start_graph", "--set", "data.name=ogb", "--set",
            f"data.options={{name: ogbg-molhiv, root: {tmp_path / 'ogb'}}}", "--set", f"out_dir={run}",
            *_sets(FAST), "--no-progress"]
    assert main(args) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["metric"], metrics["official_metric"]) == ("official", "rocauc")
    assert main(["predict", str(run), "--out", str(tmp_path / "rows.pt"), "--split", "test",
                 "--probabilities"]) == 0
    rows = torch.load(tmp_path / "rows.pt")
    graphs = get_dataset("ogb").load(name="ogbg-molhiv", root=tmp_path / "ogb")["test"]
    y_true = torch.cat([graph.y.view(-1, 1) for graph in graphs])
    y_pred = rows["probabilities"][:, 1:] - rows["probabilities"][:, :1]  # any increasing score will do
    expected = Evaluator("ogbg-molhiv").eval({"y_true": y_true, "y_pred": y_pred})["rocauc"]
    assert metrics["test"] == pytest.approx(expected, abs=1e-5)
