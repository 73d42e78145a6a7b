"""The dataset ``file``: a user's graph from a saved ``.pt`` or from edge and node tables (CSV, Parquet), the
same graph either way, and every bad input refused in one line naming the file and the field."""

import csv
import re
import sys
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data

from kmipgt.cli import main
from kmipgt.data import load_dataset, load_file

N = 6
IDS = [f"n{7 * node}" for node in range(N)]  # ids as a user names nodes, not row numbers
SPLIT = ["train", "train", "val", "test", "test", ""]  # node 5 is in no split
PARQUET = pytest.param(".parquet", marks=pytest.mark.requires("pyarrow"))


def _graph() -> Data:
    """Six nodes, seven directed edges with one feature, three classes, node 5 in no split."""
    masks = {f"{split}_mask": torch.tensor([s == split for s in SPLIT]) for split in ("train", "val", "test")}
    return Data(x=torch.arange(2.0 * N).view(N, 2) / 4, edge_index=torch.tensor([[0, 1, 2, 3, 4, 5, 0],
                                                                                 [1, 2, 3, 4, 5, 0, 3]]),
                edge_attr=torch.arange(7.0).view(7, 1) / 2, y=torch.tensor([0, 1, 2, 0, 1, 2]), **masks)


def _tables(graph: Data, ids: list) -> tuple[dict, dict]:
    """The node and edge columns of ``graph``, its nodes named by ``ids``."""
    nodes = {"id": list(ids), "f0": graph.x[:, 0].tolist(), "f1": graph.x[:, 1].tolist(),
             "label": graph.y.tolist(), "split": [s or None for s in SPLIT]}
    source, target = graph.edge_index.tolist()
    edges = {"source": [ids[i] for i in source], "target": [ids[i] for i in target],
             "w": graph.edge_attr[:, 0].tolist()}
    return nodes, edges


def _write(path, columns: dict) -> None:
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table(columns), path)
        return
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        writer.writerows([["" if v is None else v for v in row] for row in zip(*columns.values())])


def _write_folder(folder, nodes: dict, edges: dict, suffix: str = ".csv"):
    folder.mkdir(exist_ok=True)
    _write(folder / f"nodes{suffix}", nodes)
    _write(folder / f"edges{suffix}", edges)
    return folder


@pytest.mark.parametrize("suffix", [".csv", PARQUET])
def test_tables_and_a_saved_graph_load_to_the_same_graph(tmp_path, suffix):
    graph = _graph()
    torch.save(graph, tmp_path / "graph.pt")
    folder = _write_folder(tmp_path / "tables", *_tables(graph, IDS), suffix)
    saved, read = load_file(tmp_path / "graph.pt"), load_file(folder)
    for loaded in (saved, read):
        for key in ("x", "edge_index", "edge_attr", "y", "train_mask", "val_mask", "test_mask"):
            assert torch.equal(loaded[key], graph[key]), key
    assert read.x.dtype == torch.float32 and read.edge_index.dtype == torch.int64
    assert read.node_ids == IDS and "label_names" not in read
    assert torch.equal(load_dataset("file", path=folder).x, graph.x)


def test_node_ids_round_trip_through_a_saved_graph(tmp_path):
    read = load_file(_write_folder(tmp_path / "tables", *_tables(_graph(), IDS)))
    torch.save(read, tmp_path / "read.pt")
    assert load_file(tmp_path / "read.pt").node_ids == IDS


@pytest.mark.parametrize("suffix", [".csv", PARQUET])
def test_integer_ids_name_the_node_table_rows_in_its_order(tmp_path, suffix):
    ids = [30, 10, 20, 60, 50, 40]
    nodes, edges = _tables(_graph(), ids)
    edges["source"] = [str(v) for v in edges["source"]]  # text ids find integer ones
    read = load_file(_write_folder(tmp_path, nodes, edges, suffix))
    assert read.node_ids == ids and all(type(v) is int for v in read.node_ids)
    assert torch.equal(read.edge_index, _graph().edge_index)


@pytest.mark.parametrize("suffix", [".csv", PARQUET])
@pytest.mark.parametrize(("labels", "y", "names"), [
    (["b", "a", None, "c", "a", "b"], [1, 0, -1, 2, 0, 1], ["a", "b", "c"]),  # names: ids in sorted order
    ([2, 0, None, 1, 1, 0], [2, 0, -1, 1, 1, 0], None),  # class ids, -1 where a node has no label
    ([0.5, -1.25, None, 2.0, 0.0, 3.5], [0.5, -1.25, float("nan"), 2.0, 0.0, 3.5], None),  # targets
])
def test_labels_are_class_names_class_ids_or_targets(tmp_path, suffix, labels, y, names):
    nodes, edges = _tables(_graph(), IDS)
    read = load_file(_write_folder(tmp_path, {**nodes, "label": labels}, edges, suffix))
    expected = torch.tensor(y)
    assert read.y.dtype == expected.dtype and torch.equal(read.y.isnan(), expected.isnan())
    assert torch.equal(read.y.nan_to_num(), expected.nan_to_num())
    assert read.get("label_names") == names


@pytest.mark.parametrize(("labels", "printed"), [
    ([2, 0, None, 1, 1, 0], ["unlabelled_nodes: 1", "classes: 3", "class_sizes: [2, 2, 1]"]),
    ([0.5, -1.25, None, 2.0, 0.0, 3.5], ["unlabelled_nodes: 1", "label_min_median_max: [[-1.25, 0.5, 3.5]]"]),
])
def test_data_info_counts_the_labelled_nodes(tmp_path, capsys, labels, printed):
    nodes, edges = _tables(_graph(), IDS)
    folder = _write_folder(tmp_path, {**nodes, "label": labels}, edges)
    assert main(["data", "info", "file", "--set", f"path={folder}"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert all(line in out for line in printed), out


def test_an_edge_table_with_its_node_table_and_the_columns_named(tmp_path):
    nodes, edges = _tables(_graph(), IDS)
    nodes.pop("split")
    _write(tmp_path / "e.csv", {**edges, "when": [1] * 7})
    _write(tmp_path / "n.csv", {**nodes, "extra": [9] * N})
    read = load_file(tmp_path / "e.csv", nodes=tmp_path / "n.csv", features=["f1", "f0"], edge_features="w")
    assert torch.equal(read.x, _graph().x.flip(1)) and torch.equal(read.edge_attr, _graph().edge_attr)
    assert "train_mask" not in read  # no split column: training draws the split
    assert "edge_attr" not in load_file(tmp_path / "e.csv", nodes=tmp_path / "n.csv", edge_features=[])


def test_a_list_and_a_split_dict_load_as_saved(tmp_path):
    graphs = [_graph(), Data(x=torch.ones(2, 2), edge_index=torch.tensor([[0], [1]]), y=torch.tensor([1]))]
    torch.save(graphs, tmp_path / "list.pt")
    torch.save({"train": graphs, "val": graphs[:1], "test": graphs[1:]}, tmp_path / "splits.pt")
    listed, split = load_file(tmp_path / "list.pt"), load_file(tmp_path / "splits.pt")
    assert isinstance(listed, list) and [g.num_nodes for g in listed] == [6, 2]
    sizes = {name: [g.num_nodes for g in graphs] for name, graphs in split.items()}
    assert sizes == {"train": [6, 2], "val": [6], "test": [2]}
    assert torch.equal(split["train"][0].x, graphs[0].x)


def test_parquet_without_pyarrow_names_the_extra(tmp_path, monkeypatch):
    folder = tmp_path / "tables"
    folder.mkdir()
    (folder / "edges.parquet").write_bytes(b"")
    (folder / "nodes.parquet").write_bytes(b"")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    with pytest.raises(ImportError, match=r"pip install 'kmipgt\[parquet\]'"):
        load_file(folder)


@pytest.mark.parametrize(("path", "named"), [("missing.pt", "missing.pt"), ("missing.csv", "missing.csv"),
                                             ("empty", "empty")])
def test_a_missing_file_is_named(tmp_path, path, named):
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=named):
        load_file(tmp_path / path)


def _drop(column):
    return lambda table: table.pop(column)


def _set(column, row, value):
    return lambda table: table[column].__setitem__(row, value)


# (which table, its edit, the words of the message besides the file's name, options)
TABLE_CASES = {
    "no source": ("edges", _drop("source"), "'source'", {}),
    "no target": ("edges", _drop("target"), "'target'", {}),
    "no id": ("nodes", _drop("id"), "'id'", {}),
    "no label": ("nodes", _drop("label"), "'label'", {}),
    "repeated id": ("nodes", _set("id", 3, "n0"), "column 'id' holds 'n0' twice", {}),
    "unknown edge id": ("edges", _set("target", 2, "n99"), "column 'target' holds 'n99', which is no id", {}),
    "text feature": ("nodes", _set("f1", 2, "abc"), "column 'f1' holds 'abc' (node 'n14')", {}),
    "empty feature": ("nodes", _set("f0", 1, None), "column 'f0' holds '' (node 'n7')", {}),
    "nan feature": ("nodes", _set("f0", 4, "nan"), "column 'f0' holds nan (node 'n28')", {}),
    "infinite edge feature": ("edges", _set("w", 0, "-inf"), "column 'w' holds -inf (edge 'n0' -> 'n7')", {}),
    "too large a feature": ("nodes", _set("f1", 0, "1e300"), "column 'f1' holds 1e+300", {}),
    "unknown split": ("nodes", _set("split", 0, "training"), "column 'split' holds 'training'", {}),
    "negative class id": ("nodes", _set("label", 0, -3), "column 'label' must hold class ids", {}),
    "infinite target": ("nodes", _set("label", 0, "inf"), "column 'label' holds an infinite value", {}),
    "unknown feature": ("nodes", _drop("split"), "no column 'f9'", {"features": ["f9"]}),
    "label as a feature": ("nodes", _drop("split"), "column 'label' cannot be a feature",
                           {"features": ["label"]}),
    "no features": ("nodes", lambda t: [t.pop("f0"), t.pop("f1")], "no feature columns", {}),
}


@pytest.mark.parametrize("case", TABLE_CASES)
def test_bad_tables_are_refused_in_one_line_naming_the_file_and_column(tmp_path, case):
    table, edit, words, options = TABLE_CASES[case]
    nodes, edges = _tables(_graph(), IDS)
    edit(nodes if table == "nodes" else edges)
    folder = _write_folder(tmp_path, nodes, edges)
    with pytest.raises(ValueError) as raised:
        load_file(folder, **options)
    message = str(raised.value)
    assert f"{folder / table}.csv" in message and words in message and "\n" not in message, message


@pytest.mark.requires("pyarrow")
def test_parquet_values_are_named_as_written(tmp_path):
    nodes, edges = _tables(_graph(), list(range(N)))
    edges["target"][2] = 99
    folder = _write_folder(tmp_path, nodes, edges, ".parquet")
    with pytest.raises(ValueError, match=r"edges.parquet: column 'target' holds 99, which is no id"):
        load_file(folder)


def _with(**changes):
    def saved():
        graph = _graph()
        for key, value in changes.items():
            graph[key] = value
        return graph

    return saved


def _nan_at(row):
    x = _graph().x
    x[row, 1] = float("nan")
    return x


# (what the file holds, the words of the message besides the file's name)
SAVED_CASES = {
    "a dict": (lambda: {"weights": torch.ones(2)}, "holds a dict with keys ['weights']"),
    "a tensor": (lambda: torch.ones(2), "holds a Tensor"),
    "edge ids out of range": (_with(edge_index=torch.tensor([[0, 6], [1, 2]])),
                              "edge_index must hold node ids in [0, 6)"),
    "nan in x": (_with(x=_nan_at(3)), "x holds NaN or infinite values (row 3)"),
    "infinite edge_attr": (_with(edge_attr=torch.full((7, 1), float("inf"))), "edge_attr holds NaN"),
    "edge_attr per node": (_with(edge_attr=torch.ones(6, 1)), "edge_attr must have shape [7, F_e]"),
    "a short mask": (_with(val_mask=torch.ones(5, dtype=torch.bool)), "val_mask must be a boolean tensor"),
    "an index mask": (_with(test_mask=torch.tensor([3, 4])), "test_mask must be a boolean tensor"),
    "overlapping masks": (_with(test_mask=torch.tensor([True, *[False] * 5])),
                          "node 0 is in both train_mask and test_mask"),
    "no x": (_with(x=None), "has no x"),
    "short node_ids": (_with(node_ids=IDS[:3]), "node_ids must be a list of 6 ids"),
    "a list holding a tensor": (lambda: [_graph(), torch.ones(2)], "[1] is a Tensor, not a PyG Data"),
    "an empty list": (lambda: [], "holds no graphs"),
    "a split with a bad graph": (lambda: {"train": [_graph()], "val": [_with(x=_nan_at(0))()], "test": []},
                                 "val[0]: x holds NaN"),
    "a split that is no list": (lambda: {"train": [_graph()], "val": _graph(), "test": [_graph()]},
                                "val must be a list of PyG Data"),
}


@pytest.mark.parametrize("case", SAVED_CASES)
def test_bad_saved_graphs_are_refused_in_one_line_naming_the_file_and_tensor(tmp_path, case):
    make, words = SAVED_CASES[case]
    path = tmp_path / "graph.pt"
    torch.save(make(), path)
    with pytest.raises(ValueError) as raised:
        load_file(path)
    message = str(raised.value)
    assert message.startswith(str(path)) and words in message and "\n" not in message, message


@pytest.mark.parametrize(("name", "content", "options", "words"), [
    ("graph.txt", "x", {}, "unknown graph file extension .txt"),
    ("junk.pt", "junk", {}, "is not a graph saved with torch.save"),
    ("edges.csv", "source,target\n", {}, "name its node table with the option nodes"),
    ("edges.csv", "source,target\nn0\n", {"nodes": "n.csv"}, "line 2 has 1 fields, the header 2"),
    ("graph.pt", None, {"features": ["f0"]}, "the option features applies to tables only"),
])
def test_bad_files_are_refused_in_one_line_naming_them(tmp_path, monkeypatch, name, content, options, words):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path / "n.csv", _tables(_graph(), IDS)[0])
    if content is None:
        torch.save(_graph(), tmp_path / name)
    else:
        (tmp_path / name).write_text(content)
    with pytest.raises(ValueError) as raised:
        load_file(tmp_path / name, **options)
    message = str(raised.value)
    assert str(tmp_path / name) in message and words in message and "\n" not in message, message


def test_the_worked_example_of_the_docs_prints_what_they_say(tmp_path, monkeypatch, capsys):
    section = (Path(__file__).resolve().parents[2] / "docs" / "datasets.md").read_text().split(
        "## Your own graph (`file`)")[1].split("\n## ")[0]
    code, printed = re.search(r"```python\n(.*?)```\n\nprints `(.*?)`", section, flags=re.DOTALL).groups()
    monkeypatch.chdir(tmp_path)
    exec(code, {})
    assert capsys.readouterr().out.strip() == printed
