"""Graphs of one's own through the whole pipeline: ``kmipgt train --data`` on a saved graph and on the same
graph as tables, predictions in the user's ids, evaluation, export, a sweep over a dataset's splits, and
every bad input refused in one line with nothing written."""

import csv
import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from sklearn.metrics import roc_auc_score
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from kmipgt.cli import main
from kmipgt.train import load_config
from kmipgt.train.config_reading import parse_override
from kmipgt.train.datasets import prepare_data

N = 90
FAST = ["--set", "optim.epochs=3", "--set", "optim.warmup_epochs=1", "--set", "optim.eval_every=1",
        "--set", "model.channels=8", "--set", "model.num_layers=2", "--set", "model.attention.k=4",
        "--set", "threads=1", "--set", "device=cpu", "--no-progress"]


def _graph(classes: int = 3, seed: int = 0) -> Data:
    """A random graph of N nodes whose class is its first feature's tercile (or sign), split 60/15/15 with
    the rest in no split."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, 4, generator=gen)
    y = (x[:, 0] > 0).long() if classes == 2 else torch.bucketize(x[:, 0], torch.tensor([-0.43, 0.43]))
    part = torch.arange(N) % 6
    return Data(x=x, edge_index=to_undirected(torch.randint(0, N, (2, 3 * N), generator=gen)), y=y,
                train_mask=part < 4, val_mask=part == 4, test_mask=part == 5)


def _write_tables(graph: Data, folder: Path) -> Path:
    folder.mkdir()
    split = ["train" if t else "val" if v else "test" for t, v in zip(graph.train_mask, graph.val_mask)]
    with open(folder / "nodes.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["id", "a", "b", "c", "d", "label", "split"])
        for node in range(graph.num_nodes):
            writer.writerow([f"n{node}", *graph.x[node].tolist(), int(graph.y[node]), split[node]])
    with open(folder / "edges.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["source", "target"])
        writer.writerows([[f"n{s}", f"n{t}"] for s, t in graph.edge_index.T.tolist()])
    return folder


def _train(data: Path, out: Path, *extra: str) -> int:
    return main(["train", "--data", str(data), "--set", f"out_dir={out}", *FAST, *extra])


def _error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("task: ")]
    assert len(lines) == 1 and lines[0].startswith("kmipgt: error: "), lines
    return lines[0]


def test_a_saved_graph_and_the_same_graph_as_tables_train_to_the_same_metrics(tmp_path):
    graph = _graph()
    torch.save(graph, tmp_path / "graph.pt")
    _write_tables(graph, tmp_path / "tables")
    assert _train(tmp_path / "graph.pt", tmp_path / "from_pt") == 0
    assert _train(tmp_path / "tables", tmp_path / "from_tables") == 0
    saved, tables = (json.loads((tmp_path / run / "metrics.json").read_text()) for run in ("from_pt",
                                                                                           "from_tables"))
    assert saved["metric"] == tables["metric"] == "accuracy"  # three classes, read from the labels
    for split in ("train", "val", "test"):
        assert tables[split] == pytest.approx(saved[split], abs=1e-6)


def test_predictions_of_a_data_run_name_the_users_nodes_and_the_run_evaluates_and_exports(tmp_path, capsys):
    _write_tables(_graph(), tmp_path / "tables")
    run = tmp_path / "run"
    assert _train(tmp_path / "tables", run) == 0
    assert main(["predict", str(run), "--out", str(tmp_path / "rows.csv"), "--split", "test"]) == 0
    with open(tmp_path / "rows.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["node"] for row in rows] == [f"n{node}" for node in range(5, N, 6)]
    capsys.readouterr()
    assert main(["eval", str(run)]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["test"] == pytest.approx(json.loads((run / "metrics.json").read_text())["test"])
    assert main(["export", str(run), "--out", str(tmp_path / "model.pt2")]) == 0


@pytest.mark.parametrize("loss", ["cross_entropy", "bce"])
def test_a_two_class_node_task_is_scored_by_roc_auc_under_either_loss(tmp_path, loss):
    graph = _graph(classes=2)
    if loss == "bce":
        graph.y = graph.y.float()
    torch.save(graph, tmp_path / "graph.pt")
    run = tmp_path / "run"
    task = ["--set", f"task.loss={loss}", "--set", "task.metric=roc_auc"]
    assert _train(tmp_path / "graph.pt", run, *task) == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["metric"] == "roc_auc"
    rows = tmp_path / "rows.csv"
    assert main(["predict", str(run), "--out", str(rows), "--split", "test", "--probabilities"]) == 0
    with open(rows) as handle:
        table = list(csv.DictReader(handle))
    # Independent reference: scikit-learn on the positive class's probability of the best checkpoint.
    positive = [float(row["probability_1" if loss == "cross_entropy" else "probability"]) for row in table]
    labels = graph.y[graph.test_mask].long().tolist()
    assert metrics["test"] == pytest.approx(roc_auc_score(labels, positive), abs=1e-5)


def test_the_task_is_read_from_the_labels_and_printed(tmp_path, capsys):
    torch.save(_graph(classes=2), tmp_path / "graph.pt")
    assert _train(tmp_path / "graph.pt", tmp_path / "run") == 0
    first = capsys.readouterr().err.strip().splitlines()[0]
    assert first.startswith("task: node level, cross_entropy loss, roc_auc metric (read from the data: 2 "
                            "classes")
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "level: node" in saved and "metric: roc_auc" in saved  # the run keeps what was chosen


def test_a_sweep_over_a_datasets_splits_reports_mean_and_spread(tmp_path):
    graph = _graph()
    part = torch.stack([torch.roll(torch.arange(N) % 6, shift) for shift in range(3)], 1)
    graph.train_mask, graph.val_mask, graph.test_mask = part < 4, part == 4, part == 5  # [N, 3]
    torch.save(graph, tmp_path / "graph.pt")
    sweep = tmp_path / "splits.yaml"
    sweep.write_text(json.dumps({
        "base": "start_node", "out": str(tmp_path / "sweep"),
        "set": {"data.name": "file", "data.options": {"path": str(tmp_path / "graph.pt")},
                **dict(map(parse_override, FAST[1:-1:2]))},
        "grid": {"data.split_index": [0, 1, 2]},
    }))
    assert main(["sweep", str(sweep), "--jobs", "1"]) == 0
    summary = (tmp_path / "sweep" / "summary.md").read_text()
    assert "±" in summary and "3" in summary
    # The cells saved the task they read from the data, which the sweep's config leaves open: done.
    assert main(["sweep", str(sweep), "--jobs", "1"]) == 0
    assert (tmp_path / "sweep" / "summary.md").read_text() == summary
    beyond = load_config("start_node", ["data.split_index=3", f"data.options.path={tmp_path}/graph.pt"])
    with pytest.raises(ValueError, match=r"data\.split_index 3 picks a split of train_mask, which holds 3"):
        prepare_data(beyond)


def _without_labels(graph: Data) -> Data:
    del graph.y
    return graph


def _short_mask(graph: Data) -> Data:
    graph.val_mask = graph.val_mask[:-1]
    return graph


def _overlapping(graph: Data) -> Data:
    graph.val_mask = graph.val_mask | graph.train_mask
    return graph


def _unlabelled_test(graph: Data) -> Data:
    graph.y[graph.test_mask] = -1
    return graph


def _nan_feature(graph: Data) -> Data:
    graph.x[3, 1] = float("nan")
    return graph


def _edge_out_of_range(graph: Data) -> Data:
    graph.edge_index[1, 0] = N + 5
    return graph


@pytest.mark.parametrize(("spoil", "message"), [
    (_without_labels, "no labels y"),
    (_short_mask, r"val_mask must be a boolean tensor of shape \[90\] or \[90, S\]"),
    (_overlapping, r"node 0 is in both train_mask and val_mask"),
    (_unlabelled_test, r"the test split holds no labelled node"),
    (_nan_feature, r"x holds NaN or infinite values"),
    (_edge_out_of_range, r"edge_index must hold node ids in \[0, 90\)"),
])
def test_a_bad_saved_graph_is_one_line_exit_2_and_no_run_folder(tmp_path, capsys, spoil, message):
    torch.save(spoil(_graph()), tmp_path / "graph.pt")
    assert _train(tmp_path / "graph.pt", tmp_path / "run") == 2
    line = _error_line(capsys)
    assert "graph.pt" in line
    assert re.search(message, line), line
    assert not (tmp_path / "run").exists()


def test_duplicate_node_ids_in_a_table_are_one_line_exit_2(tmp_path, capsys):
    folder = _write_tables(_graph(), tmp_path / "tables")
    text = (folder / "nodes.csv").read_text().replace("n1,", "n0,", 1)
    (folder / "nodes.csv").write_text(text)
    assert _train(folder, tmp_path / "run") == 2
    line = _error_line(capsys)
    assert "nodes.csv" in line and "'id'" in line and "n0" in line
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("options", "message"), [
    ("{class: torch_geometric.datasets.KarateClub}", "not a dataset class of torch_geometric.datasets"),
    ("{class: KarateClub, root: /tmp}", "pyg class KarateClub takes no root"),
    ("{class: KarateClub, transfrom: null}", "transfrom"),
])
def test_a_pyg_class_that_is_not_there_or_an_option_it_does_not_take_is_one_line(tmp_path, capsys, options,
                                                                                  message):
    args = ["train", "--config", "start_node", "--set", "data.name=pyg", "--set", f"data.options={options}",
            "--set", f"out_dir={tmp_path / 'run'}", *FAST]
    assert main(args) == 2
    assert message in _error_line(capsys)
    assert not (tmp_path / "run").exists()


def test_the_worked_example_of_the_docs_runs(tmp_path, monkeypatch):
    """The docs' example of a graph of one's own, its Python and then each command (training shortened)."""
    section = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text().split(
        "## Your own data\n")[1].split("\n## ")[0]
    code, commands = re.findall(r"```(?:python|bash)\n(.*?)```", section, flags=re.DOTALL)[:2]
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    for line in commands.splitlines():
        args = shlex.split(line.split("#")[0])[1:]
        if args[0] == "train":
            args += FAST
        assert main(args) == 0, line
    with open("predictions.csv") as handle:
        assert next(csv.DictReader(handle))["node"].startswith("user")
