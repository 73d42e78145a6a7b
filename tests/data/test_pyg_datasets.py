"""The ``pyg`` source: any dataset class of ``torch_geometric.datasets`` by name, read from a local root, in
the form kmipgt's tasks take (one ``Data``, three graph lists, or a plain list); nothing downloaded unless
asked."""

import networkx as nx
import numpy as np
import pytest
import torch
import torch_geometric.data.download
import torch_geometric.datasets.webkb
from torch_geometric.data import Data
from torch_geometric.datasets import WebKB

from kmipgt.data import get_dataset
from kmipgt.data.pyg_datasets import pyg_dataset
from kmipgt.safe_load import RefusedFileError
from lrgb_copies import write_raw_peptides
from payloads import PAYLOADS
from pyg_copies import WEBKB_SPLITS, write_tu, write_webkb


def _load(cls, /, **options):
    return pyg_dataset(**{"class": cls}, **options)


def _edge_set(edge_index: torch.Tensor) -> set[tuple[int, int]]:
    return set(map(tuple, edge_index.t().tolist()))


@pytest.fixture
def no_download(monkeypatch):
    """Every way WebKB could download fails the test."""
    def fail(*args, **kwargs):
        pytest.fail("a download was attempted")

    for module in (torch_geometric.data.download, torch_geometric.datasets.webkb):
        monkeypatch.setattr(module, "download_url", fail)
    monkeypatch.setattr(WebKB, "download", fail)


def test_karate_club_is_one_graph_with_the_karate_club_edges():
    data = _load("KarateClub")
    assert isinstance(data, Data) and data.num_nodes == 34
    reference = nx.karate_club_graph()
    expected = {(i, j) for i, j in reference.edges} | {(j, i) for i, j in reference.edges}
    assert _edge_set(data.edge_index) == expected
    assert data.train_mask.dtype == torch.bool and data.train_mask.shape == (34,)


def test_fake_dataset_gives_one_graph_or_a_plain_list():
    torch.manual_seed(0)
    one = _load("FakeDataset", avg_num_nodes=20, num_channels=3)
    assert isinstance(one, Data) and one.x.shape == (one.num_nodes, 3) and one.y.shape == (one.num_nodes,)
    many = _load("FakeDataset", num_graphs=5, avg_num_nodes=10, num_channels=3, num_classes=2)
    assert isinstance(many, list) and len(many) == 5 and all(isinstance(graph, Data) for graph in many)
    assert all(graph.y.numel() == 1 for graph in many)  # graph-level labels


def test_a_stochastic_block_model_is_generated_once_under_root_and_then_read(tmp_path, monkeypatch):
    options = {"root": tmp_path, "block_sizes": [6, 4], "edge_probs": [[0.8, 0.1], [0.1, 0.8]]}
    first = _load("StochasticBlockModelDataset", **options)
    assert first.y.tolist() == [0] * 6 + [1] * 4
    assert list(tmp_path.glob("StochasticBlockModelDataset/processed/*.pt"))

    def fail(*args, **kwargs):
        pytest.fail("PyG's reader of processed files was used")

    monkeypatch.setattr(torch_geometric.io.fs, "torch_load", fail)
    again = _load("StochasticBlockModelDataset", **options)  # random edges: equal only if read back
    assert torch.equal(again.edge_index, first.edge_index)


def test_webkb_copy_is_read_with_its_ten_splits_as_columns(tmp_path, no_download):
    written = write_webkb(tmp_path, "cornell")
    data = _load("WebKB", root=tmp_path, name="Cornell")
    assert torch.equal(data.x, torch.tensor(written["x"], dtype=torch.float))
    assert torch.equal(data.y, torch.tensor(written["y"]))
    assert _edge_set(data.edge_index) == set(map(tuple, written["edges"].tolist()))
    for key in ("train_mask", "val_mask", "test_mask"):
        assert getattr(data, key).shape == (len(written["y"]), WEBKB_SPLITS)
        assert torch.equal(getattr(data, key), torch.from_numpy(written[key]))


def test_a_tu_dataset_without_a_split_is_a_plain_list_of_its_graphs(tmp_path):
    written = write_tu(tmp_path, "TOY")
    graphs = _load("TUDataset", root=tmp_path, name="TOY")
    assert isinstance(graphs, list) and len(graphs) == len(written)
    lowest = min(int(graph["node_labels"].min()) for graph in written)
    labels = np.unique([graph["label"] for graph in written], return_inverse=True)[1]
    for graph, reference, label in zip(graphs, written, labels, strict=True):
        assert graph.num_nodes == len(reference["node_labels"])
        assert _edge_set(graph.edge_index) == set(map(tuple, reference["edges"].tolist()))
        # PyG one-hot encodes node labels, counted from the smallest label of the whole dataset
        assert torch.equal(graph.x.argmax(1), torch.tensor(reference["node_labels"] - lowest))
        assert graph.y.tolist() == [label]


def test_a_class_with_a_split_argument_gives_its_three_splits(tmp_path):
    written = write_raw_peptides(tmp_path, {"train": [3, 4, 5], "val": [4], "test": [6, 3]})
    parts = _load("LRGBDataset", root=tmp_path, name="Peptides-func")
    assert list(parts) == ["train", "val", "test"]
    for split, graphs in parts.items():
        assert [graph.num_nodes for graph in graphs] == [len(item[0]) for item in written[split]]
        assert all(torch.equal(graph.x, item[0]) for graph, item in zip(graphs, written[split], strict=True))
    # A split asked for is taken as the whole dataset (the tasks split it by ratios).
    only_test = _load("LRGBDataset", root=tmp_path, name="Peptides-func", split="test")
    assert isinstance(only_test, list) and [graph.num_nodes for graph in only_test] == [6, 3]


def test_missing_raw_files_are_named_with_their_folder_and_nothing_is_downloaded(tmp_path, no_download):
    raw = tmp_path / "cornell" / "raw"
    with pytest.raises(FileNotFoundError) as caught:
        _load("WebKB", root=tmp_path, name="Cornell")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"WebKB: missing raw files in {raw}: ")
    names = ["out1_node_feature_label.txt", "out1_graph_edges.txt",
             *(f"cornell_split_0.6_0.2_{i}.npz" for i in range(WEBKB_SPLITS))]
    assert all(name in message for name in names) and "download: true" in message


def test_download_true_lets_the_class_download(tmp_path, monkeypatch):
    downloaded = []

    def download(self):  # stands in for the network: lays out the files as WebKB's download would
        downloaded.append(self.raw_dir)
        write_webkb(tmp_path, "cornell")

    monkeypatch.setattr(WebKB, "download", download)
    data = _load("WebKB", root=tmp_path, name="Cornell", download=True)
    assert downloaded == [str(tmp_path / "cornell" / "raw")] and data.train_mask.shape[1] == WEBKB_SPLITS


@pytest.mark.parametrize(("name", "message"), [
    ("KarateClb", r"^class 'KarateClb' is not a dataset class of torch_geometric.datasets; close names: "
                  r"KarateClub$"),
    ("webkb", r"close names: WebKB$"),
    ("torch_geometric.datasets.Planetoid", r"\(a config names a class, never an import path\)"),
    ("os:system", r"never an import path"),
    ("Data", r"'Data' is not a dataset class"),
    (None, r"dataset 'pyg' needs the option class"),
])
def test_only_dataset_classes_of_torch_geometric_datasets_are_named(name, message):
    with pytest.raises(ValueError, match=message):
        pyg_dataset(**{"class": name})


def test_an_option_the_class_does_not_take_is_named_with_its_options(tmp_path):
    with pytest.raises(ValueError, match=r"^pyg class WebKB takes no option 'nme'; its options: root, name, "
                                         r"transform, pre_transform, force_reload$"):
        _load("WebKB", root=tmp_path, nme="Cornell")
    with pytest.raises(ValueError, match=r"^pyg class WebKB: missing a required argument: 'name'; its"):
        _load("WebKB", root=tmp_path)
    with pytest.raises(ValueError, match=r"^pyg class KarateClub takes no root"):
        _load("KarateClub", root=tmp_path)
    with pytest.raises(ValueError, match=r"^pyg class FakeDataset takes no root"):  # not a graph attribute
        _load("FakeDataset", root=tmp_path)


def test_a_class_of_heterogeneous_graphs_is_refused():
    with pytest.raises(ValueError, match=r"^pyg class FakeHeteroDataset gives HeteroData graphs"):
        _load("FakeHeteroDataset", avg_num_nodes=5)


@pytest.mark.parametrize("payload", PAYLOADS)
def test_processed_files_are_read_without_running_their_code(tmp_path, payload):
    write_webkb(tmp_path, "cornell")
    _load("WebKB", root=tmp_path, name="Cornell")
    processed, marker = tmp_path / "cornell" / "processed", tmp_path / "marker"
    torch.save(payload(marker), processed / "pre_transform.pt")  # PyG would compare it, fully unpickled
    assert _load("WebKB", root=tmp_path, name="Cornell").num_nodes == 9
    torch.save(payload(marker), processed / "data.pt")
    with pytest.raises(RefusedFileError):
        _load("WebKB", root=tmp_path, name="Cornell")
    assert not marker.exists()


def test_the_registry_serves_it_at_every_level(tmp_path):
    write_webkb(tmp_path, "texas")
    data = get_dataset("pyg").load(**{"class": "WebKB", "root": tmp_path, "name": "Texas"})
    assert data.train_mask.shape == (9, WEBKB_SPLITS)
    assert get_dataset("pyg").levels == ("node", "edge", "graph") and get_dataset("pyg").extra is None
