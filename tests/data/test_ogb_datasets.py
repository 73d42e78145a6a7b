"""The ``ogb`` source: OGB's node- and graph-property datasets from a local release with their official split,
and the official Evaluator's metric, checked against scikit-learn on hand-made arrays."""

import builtins
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, average_precision_score, roc_auc_score

from kmipgt.data import get_dataset
from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from kmipgt.data.ogb_datasets import _ogb, ogb_categories, ogb_dataset, ogb_evaluator_metric
from pyg_copies import write_ogbg_molhiv, write_ogbn_arxiv

pytestmark = pytest.mark.requires("ogb", "pandas")


def _edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


@pytest.fixture
def offline(monkeypatch):
    """OGB's prompts and downloads fail the test."""
    _ogb("nodeproppred")  # imported as the loader imports it
    import ogb.utils.url

    def fail(*args, **kwargs):
        pytest.fail("OGB asked a question or downloaded")

    monkeypatch.setattr(builtins, "input", fail)
    for module in (ogb.utils.url, sys.modules["ogb.nodeproppred.dataset_pyg"],
                   sys.modules["ogb.graphproppred.dataset_pyg"]):
        monkeypatch.setattr(module, "decide_download", fail)
        monkeypatch.setattr(module, "download_url", fail)


def test_a_node_property_release_gives_its_graph_with_the_official_split_as_masks(tmp_path, offline):
    written = write_ogbn_arxiv(tmp_path)
    data = ogb_dataset("ogbn-arxiv", tmp_path)
    assert torch.equal(data.x, torch.tensor(written["x"], dtype=torch.float32))
    assert torch.equal(data.y, torch.tensor(written["y"]).view(-1, 1))
    assert _edge_set(data.edge_index) == set(map(tuple, written["edges"].tolist()))  # arxiv: as released
    for mask, part in (("train_mask", "train"), ("val_mask", "valid"), ("test_mask", "test")):
        assert getattr(data, mask).dtype == torch.bool
        assert getattr(data, mask).nonzero().view(-1).tolist() == written[part].tolist()
    again = ogb_dataset("ogbn-arxiv", tmp_path)  # from OGB's processed file
    assert torch.equal(again.edge_index, data.edge_index)


def test_a_graph_property_release_gives_the_official_split_as_three_lists(tmp_path, offline):
    written = write_ogbg_molhiv(tmp_path)
    parts = ogb_dataset("ogbg-molhiv", tmp_path)
    assert list(parts) == ["train", "val", "test"]
    for part, key in (("train", "train"), ("val", "valid"), ("test", "test")):
        assert len(parts[part]) == len(written[key])
        for graph, index in zip(parts[part], written[key], strict=True):
            reference = written["graphs"][index]
            assert torch.equal(graph.x, torch.tensor(reference["x"]))
            assert graph.y.tolist() == [[reference["label"]]]
            edges = set(map(tuple, reference["edges"].tolist()))
            assert _edge_set(graph.edge_index) == edges | {(j, i) for i, j in edges}  # OGB adds the inverses
            assert torch.equal(graph.edge_attr[::2], torch.tensor(reference["edge_attr"]))


def test_a_missing_copy_is_named_and_nothing_is_asked_or_downloaded(tmp_path, offline):
    folder = re.escape(str(tmp_path / "ogbn_arxiv"))
    with pytest.raises(FileNotFoundError, match=rf"^no copy of ogbn-arxiv in {folder}: .*"
                                                r"RELEASE_v1.txt, raw/, split/.*download: true"):
        ogb_dataset("ogbn-arxiv", tmp_path)
    (tmp_path / "ogbg_molhiv").mkdir()
    with pytest.raises(FileNotFoundError, match=r"ogbg_molhiv has no RELEASE_v1.txt, the marker of OGB's"):
        ogb_dataset("ogbg-molhiv", tmp_path)
    (tmp_path / "ogbg_molhiv" / "RELEASE_v1.txt").write_text("")
    raw = tmp_path / "ogbg_molhiv" / "raw"
    files = "edge.csv.gz, node-feat.csv.gz, edge-feat.csv.gz (OGB's release"
    with pytest.raises(FileNotFoundError, match=re.escape(f"missing raw files in {raw}: {files}")):
        ogb_dataset("ogbg-molhiv", tmp_path)


def test_download_true_lets_ogb_download(tmp_path, monkeypatch):
    from ogb.nodeproppred import PygNodePropPredDataset

    def download(self):  # stands in for the network: lays out the release as OGB's download does
        write_ogbn_arxiv(tmp_path / "elsewhere")
        os.replace(tmp_path / "elsewhere" / "ogbn_arxiv" / "raw", self.raw_dir)
        os.replace(tmp_path / "elsewhere" / "ogbn_arxiv" / "split", f"{self.root}/split")

    monkeypatch.setattr(PygNodePropPredDataset, "download", download)
    assert ogb_dataset("ogbn-arxiv", tmp_path, download=True).num_nodes == 12


@pytest.mark.parametrize(("name", "message"), [
    ("ogbl-collab", r"link-property datasets are not served"),
    ("ogbn-mag", r"ogbn-mag is a heterogeneous graph"),
    ("ogbg-code2", r"targets are subtoken prediction \(metric F1\)"),
    ("ogbn-arxv", r"^'ogbn-arxv' is no node- or graph-property dataset of OGB; close names: ogbn-arxiv"),
])
def test_datasets_it_does_not_serve_are_refused(tmp_path, name, message):
    with pytest.raises(ValueError, match=message):
        ogb_dataset(name, tmp_path)


def test_molecules_have_ogbs_categorical_atom_and_bond_features(tmp_path):
    from ogb.utils.features import get_atom_feature_dims, get_bond_feature_dims

    features = get_dataset("ogb").categorical_features(name="ogbg-molhiv", root=tmp_path)
    assert features.node == tuple(get_atom_feature_dims()) == OGB_ATOM_DIMS
    assert features.edge == tuple(get_bond_feature_dims()) == OGB_BOND_DIMS
    assert ogb_categories("ogbn-arxiv", tmp_path).node == ()
    assert ogb_categories("ogbg-ppa", tmp_path).edge == ()


def test_importing_ogb_asks_pypi_nothing(tmp_path):
    # ogb's first import starts a thread asking PyPI whether ogb is outdated, unless `outdated` is missing.
    code = ("import sys, threading; from kmipgt.data.ogb_datasets import ogb_evaluator_metric; "
            "ogb_evaluator_metric('ogbn-arxiv'); "
            "assert 'ogb' in sys.modules and 'outdated' not in sys.modules, sorted(sys.modules); "
            "assert threading.active_count() == 1, threading.enumerate()")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
        sys.path)}, cwd=tmp_path)


def _nan_labels(rng, count, tasks):
    labels = rng.integers(0, 2, (count, tasks)).astype(float)
    labels[rng.random((count, tasks)) < 0.2] = np.nan
    return labels


def test_the_metric_of_a_node_classification_is_the_accuracy_of_the_argmax():
    rng = np.random.default_rng(0)
    logits, targets = rng.normal(size=(50, 40)), rng.integers(0, 40, 50)
    metric, score = ogb_evaluator_metric("ogbn-arxiv")
    assert metric == "acc"
    for shaped in (targets, targets.reshape(-1, 1)):
        assert score(torch.tensor(logits), torch.tensor(shaped)) == pytest.approx(
            accuracy_score(targets, logits.argmax(1)))


def test_rocauc_averages_the_tasks_with_both_classes_over_their_labelled_examples():
    rng = np.random.default_rng(1)
    labels, scores = _nan_labels(rng, 60, 12), rng.normal(size=(60, 12))
    labels[:, 3] = np.where(np.isnan(labels[:, 3]), np.nan, 1.0)  # one class only: OGB leaves the task out
    metric, score = ogb_evaluator_metric("ogbg-moltox21")
    expected = np.mean([roc_auc_score(labels[~np.isnan(labels[:, t]), t], scores[~np.isnan(labels[:, t]), t])
                        for t in range(12) if t != 3])
    assert metric == "rocauc" and score(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(expected)


def test_rocauc_of_one_task_takes_scores_or_two_class_logits():
    rng = np.random.default_rng(2)
    labels, logits = rng.integers(0, 2, 40), rng.normal(size=(40, 2))
    probability = torch.tensor(logits).softmax(1)[:, 1].numpy()
    metric, score = ogb_evaluator_metric("ogbg-molhiv")
    assert metric == "rocauc"
    assert score(torch.tensor(logits), torch.tensor(labels).view(-1, 1)) == pytest.approx(
        roc_auc_score(labels, probability))
    assert score(torch.tensor(probability), torch.tensor(labels)) == pytest.approx(
        roc_auc_score(labels, probability))


def test_ap_and_rmse():
    rng = np.random.default_rng(3)
    labels, scores = _nan_labels(rng, 80, 128), rng.normal(size=(80, 128))
    labelled = [~np.isnan(labels[:, t]) for t in range(128)]
    metric, score = ogb_evaluator_metric("ogbg-molpcba")
    expected = np.mean([average_precision_score(labels[mask, t], scores[mask, t])
                        for t, mask in enumerate(labelled)])
    assert metric == "ap" and score(torch.tensor(scores), torch.tensor(labels)) == pytest.approx(expected)
    values, predictions = rng.normal(size=30), rng.normal(size=(30, 1))
    metric, score = ogb_evaluator_metric("ogbg-molesol")
    assert metric == "rmse" and score(torch.tensor(predictions), torch.tensor(values)) == pytest.approx(
        np.sqrt(np.mean((values - predictions[:, 0]) ** 2)))


def test_outputs_of_the_wrong_shape_are_a_value_error():
    _, score = ogb_evaluator_metric("ogbg-moltox21")
    message = "rocauc takes 12 task(s) for each of N examples, got outputs [5, 3] and targets [5, 12]"
    with pytest.raises(ValueError, match=re.escape(message)):
        score(torch.zeros(5, 3), torch.zeros(5, 12))
