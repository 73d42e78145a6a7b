import builtins
import io
import pickle
import shutil
import sys

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.io import fs

from kmipgt.data import lrgb_dataset
from lrgb_copies import peptide as _peptide
from lrgb_copies import write_original_peptides as _write_original
from payloads import PAYLOADS


def _listing(folder):
    return {str(path.relative_to(folder)): path.stat().st_mtime_ns for path in folder.rglob("*")}


def _processed(graphs, path):
    """What PyG's processing writes for a split (``InMemoryDataset.save``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    InMemoryDataset.save([Data(x=g[0], edge_attr=g[1], edge_index=g[2], y=g[3]) for g in graphs], str(path))


def test_pyg_raw_layout_then_processed_only(tmp_path):
    raw = tmp_path / "peptides-func" / "raw"
    raw.mkdir(parents=True)
    sizes = {"train": 5, "val": 2, "test": 3}
    for split, count in sizes.items():
        torch.save([_peptide(4 + i, i) for i in range(count)], raw / f"{split}.pt")
    before = _listing(tmp_path)
    dataset = lrgb_dataset(tmp_path, "Peptides-func", "val")
    assert len(dataset) == 2
    expected = _peptide(5, 1)
    for key, value in zip(("x", "edge_attr", "edge_index", "y"), expected, strict=True):
        assert torch.equal(dataset[1][key], value)
    assert _listing(tmp_path) == before  # nothing written into the copy
    shutil.rmtree(raw)  # PyG would download here; processed files must suffice
    for split, count in sizes.items():
        graphs = [_peptide(4 + i, i) for i in range(count)]
        _processed(graphs, tmp_path / "peptides-func" / "processed" / f"{split}.pt")
    test = lrgb_dataset(tmp_path, "peptides-func", "test")
    assert len(test) == 3 and torch.equal(test[2].edge_index, _peptide(6, 2)[2])


def test_pyg_superpixel_pickle_layout(tmp_path):
    raw = tmp_path / "pascalvoc-sp" / "raw"
    raw.mkdir(parents=True)
    edge_index = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    graph = (torch.rand(3, 14), torch.rand(4, 2), edge_index, [1, 0, 20])
    for split in ("train", "val", "test"):
        with open(raw / f"{split}.pickle", "wb") as handle:
            pickle.dump([graph, graph], handle)
    data = lrgb_dataset(tmp_path, "PascalVOC-SP", "train")[0]
    assert data.x.shape == (3, 14) and data.y.tolist() == [1, 0, 20]


def _fake_smiles2graph(smiles):
    """Stand-in for OGB's converter: a path graph with one node per character."""
    n = len(smiles)
    edges = np.array([np.arange(n - 1), np.arange(1, n)])
    return {"num_nodes": n, "node_feat": np.full((n, 9), ord(smiles[0])),
            "edge_feat": np.zeros((n - 1, 3), dtype=np.int64), "edge_index": edges}


def test_original_csv_layout_with_converter(tmp_path):
    _write_original(tmp_path / "peptides-functional")
    options = {"smiles2graph": _fake_smiles2graph}
    train = lrgb_dataset(tmp_path, "Peptides-func", "train", verify_md5=False, **options)
    assert len(train) == 2
    assert train[0].num_nodes == len("OCCCCC") and train[0].y.tolist() == [[0, 1] + [0] * 8]
    assert train[1].x[0, 0] == ord("C") and train[1].edge_index.shape == (2, 2)
    with pytest.raises(ValueError, match="MD5"):
        lrgb_dataset(tmp_path, "Peptides-func", "train", **options)


def test_original_csv_without_ogb_names_what_to_install(tmp_path, monkeypatch):
    for module in ("ogb", "ogb.utils"):  # as where it is not installed, whether or not it is here
        monkeypatch.setitem(sys.modules, module, None)
    _write_original(tmp_path / "peptides-functional")
    with pytest.raises(ImportError, match=r"pip install 'kmipgt\[lrgb\]'"):
        lrgb_dataset(tmp_path, "Peptides-func", verify_md5=False)


def test_missing_copy_and_bad_arguments(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        lrgb_dataset(tmp_path, "Peptides-struct")
    for expected in ("peptides-struct/raw/train.pt", "processed/train.pt",
                     "peptide_structure_normalized_dataset.csv.gz"):
        assert expected in str(error.value)
    with pytest.raises(ValueError, match="name"):
        lrgb_dataset(tmp_path, "ZINC")
    with pytest.raises(ValueError, match="split"):
        lrgb_dataset(tmp_path, "COCO-SP", "validation")


def _write_pyg_copy(root, key, layout):
    """A PyG-layout copy of ``key`` (``peptides-func`` or ``pascalvoc-sp``): its ``raw`` or ``processed``
    files."""
    folder = root / key / layout
    folder.mkdir(parents=True)
    for split in ("train", "val", "test"):
        if key == "peptides-func" and layout == "processed":
            _processed([_peptide(4, 0)], folder / f"{split}.pt")
        elif key == "peptides-func":
            torch.save([_peptide(4, 0)], folder / f"{split}.pt")
        else:
            graph = (torch.rand(3, 14), torch.rand(2, 2), torch.tensor([[0, 1], [1, 0]]), [1, 0, 2])
            with open(folder / f"{split}.pickle", "wb") as handle:
                pickle.dump([graph], handle)


class _Opened:
    """Records every file opened by name; PyG's and pickle's own readers fail if called at all."""

    def __init__(self, monkeypatch):
        self.paths = []
        real_open = io.open

        def recording_open(file, *args, **kwargs):
            self.paths.append(str(file))
            return real_open(file, *args, **kwargs)

        def fail(*args, **kwargs):
            raise AssertionError("a reader other than kmipgt's safe readers was called")

        for target in (io, builtins):
            monkeypatch.setattr(target, "open", recording_open)
        monkeypatch.setattr(fs, "torch_load", fail)
        monkeypatch.setattr(pickle, "load", fail)
        monkeypatch.setattr(pickle, "loads", fail)


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize(("key", "planted"), [
    ("peptides-func", "processed/train.pt"), ("peptides-func", "raw/val.pt"),
    ("pascalvoc-sp", "raw/test.pickle"),
])
def test_pyg_layout_files_that_would_run_code_are_refused(tmp_path, payload, key, planted, monkeypatch):
    _write_pyg_copy(tmp_path, key, planted.split("/")[0])
    path, marker = tmp_path / key / planted, tmp_path / "marker"
    with open(path, "wb") as handle:
        (torch.save if path.suffix == ".pt" else pickle.dump)([payload(marker)], handle)
    before = _listing(tmp_path)
    opened = _Opened(monkeypatch)
    with pytest.raises(ValueError, match=f"^{path} was not loaded: it refers to the global "):
        lrgb_dataset(tmp_path, key, path.stem)
    assert opened.paths.count(str(path)) == 1  # read once, by the safe reader, and by nothing else
    assert not marker.exists() and _listing(tmp_path) == before


def test_a_pre_transform_record_is_never_read(tmp_path, monkeypatch):
    # PyG compares it with the full unpickler before it uses processed files; kmipgt does not use it.
    _write_pyg_copy(tmp_path, "peptides-func", "processed")
    marker = tmp_path / "marker"
    torch.save(PAYLOADS[1](marker), tmp_path / "peptides-func" / "processed" / "pre_transform.pt")
    opened = _Opened(monkeypatch)
    assert len(lrgb_dataset(tmp_path, "Peptides-func", "train")) == 1
    assert not marker.exists() and not any(path.endswith("pre_transform.pt") for path in opened.paths)


@pytest.mark.parametrize(("edit", "message"), [
    (lambda g: (g[0], g[1], g[2] + 10, g[3]), r"edge_index must hold node ids in \[0, 4\) for 4 nodes"),
    (lambda g: (g[0], g[1], torch.cat([g[2], g[2][:1]]), g[3]),
     r"edge_index must be an integer tensor of shape \[2, E\], got torch.int64 \[3, 6\]"),
    (lambda g: (g[0], g[1], g[2].float(), g[3]), r"edge_index must be an integer tensor .* torch.float32"),
    (lambda g: g[:3], r"must be a tuple of tensors \(x, edge_attr, edge_index, y\)"),
])
def test_raw_graphs_are_checked_before_they_are_used(tmp_path, edit, message):
    raw = tmp_path / "peptides-func" / "raw"
    raw.mkdir(parents=True)
    for split in ("train", "val", "test"):
        torch.save([_peptide(4, 0), edit(_peptide(4, 1))], raw / f"{split}.pt")
    with pytest.raises(ValueError, match=f"^{raw / 'val.pt'}: graph 1:? {message}"):
        lrgb_dataset(tmp_path, "Peptides-func", "val")


def test_superpixel_labels_are_class_ids_in_range(tmp_path):
    raw = tmp_path / "coco-sp" / "raw"
    raw.mkdir(parents=True)
    edge_index = torch.tensor([[0, 1], [1, 0]])
    cases = (([1, 13, 90], None), ([1, 12, 0], "y holds 12, which is no COCO category"),
             ([1, 10**12, 0], r"y must hold class ids in \[0, 65536\), got ids in \[0, 1000000000000\]"),
             ([1.0, 2.0, 0.0], "y must hold integer class ids, got torch.float32"))
    for labels, message in cases:
        for split in ("train", "val", "test"):
            with open(raw / f"{split}.pickle", "wb") as handle:
                pickle.dump([(torch.rand(3, 14), torch.rand(2, 2), edge_index, labels)], handle)
        if message is None:  # COCO's category ids 1, 13, 90 are classes 1, 12, 80
            assert lrgb_dataset(tmp_path, "COCO-SP", "train")[0].y.tolist() == [1, 12, 80]
        else:
            with pytest.raises(ValueError, match=f"^{raw / 'train.pickle'}: graph 0: {message}"):
                lrgb_dataset(tmp_path, "COCO-SP", "train")


def test_processed_graphs_are_checked_before_they_are_used(tmp_path):
    path = tmp_path / "peptides-func" / "processed" / "train.pt"
    graphs = [_peptide(4, 0), _peptide(3, 1)]
    graphs[1] = (*graphs[1][:2], torch.tensor([[0, 1], [1, 3]]), graphs[1][3])
    for split in ("train", "val", "test"):
        _processed(graphs, path.with_name(f"{split}.pt"))
    match = r"edge_index of graph 1 must hold node ids in \[0, 3\) for 3 nodes, got ids in \[0, 3\]$"
    with pytest.raises(ValueError, match=f"^{path}: {match}"):
        lrgb_dataset(tmp_path, "Peptides-func", "train")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_a_split_pickle_that_would_run_code_is_refused(tmp_path, payload):
    _write_original(tmp_path / "peptides-functional")
    split = tmp_path / "peptides-functional" / "splits_random_stratified_peptide.pickle"
    marker = tmp_path / "marker"
    with open(split, "wb") as handle:
        pickle.dump({"train": np.array([2, 0]), "val": payload(marker), "test": np.array([3])}, handle)
    options = {"smiles2graph": _fake_smiles2graph, "verify_md5": False}
    with pytest.raises(ValueError, match=f"^{split} was not loaded: it refers to the global "):
        lrgb_dataset(tmp_path, "Peptides-func", "train", **options)
    assert not marker.exists()
    assert not list((tmp_path / "kmipgt_cache").rglob("*.npz"))  # nothing converted
    with open(split, "wb") as handle:
        pickle.dump({"train": np.array([2.0, 0.0]), "val": [1], "test": (3,)}, handle, protocol=2)
    with pytest.raises(ValueError, match="'train' must hold integer node indices, got float64"):
        lrgb_dataset(tmp_path, "Peptides-func", "train", **options)
