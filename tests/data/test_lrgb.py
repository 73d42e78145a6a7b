import csv
import gzip
import importlib.util
import pickle
import shutil

import numpy as np
import pytest
import torch

from kmipgt.data import lrgb_dataset
from payloads import PAYLOADS


def _peptide(num_nodes, seed):
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.stack([torch.arange(num_nodes - 1), torch.arange(1, num_nodes)])
    edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    return (torch.randint(0, 5, (num_nodes, 9), generator=generator),
            torch.randint(0, 3, (edge_index.size(1), 3), generator=generator),
            edge_index, torch.randint(0, 2, (1, 10), generator=generator).float())


def test_pyg_raw_layout_then_processed_only(tmp_path):
    raw = tmp_path / "peptides-func" / "raw"
    raw.mkdir(parents=True)
    sizes = {"train": 5, "val": 2, "test": 3}
    for split, count in sizes.items():
        torch.save([_peptide(4 + i, i) for i in range(count)], raw / f"{split}.pt")
    dataset = lrgb_dataset(tmp_path, "Peptides-func", "val")
    assert len(dataset) == 2
    expected = _peptide(5, 1)
    assert torch.equal(dataset[1].x, expected[0]) and torch.equal(dataset[1].y, expected[3])
    shutil.rmtree(raw)  # PyG would download here; processed files must suffice
    assert len(lrgb_dataset(tmp_path, "peptides-func", "test")) == 3


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
            "edge_feat": np.zeros((n - 1, 3)), "edge_index": edges}


def _write_original(folder):
    (folder / "raw").mkdir(parents=True)
    rows = [("CCO", [1] + [0] * 8 + [1]), ("CCCN", [0] * 10), ("OCCCCC", [0, 1] + [0] * 8), ("NC", [1] * 10)]
    with gzip.open(folder / "raw" / "peptide_multi_class_dataset.csv.gz", "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["smiles", "peptide_seq", "labels", "identifier"])
        for i, (smiles, labels) in enumerate(rows):
            writer.writerow([smiles, "SEQ", str(labels), f"id{i}"])
    with open(folder / "splits_random_stratified_peptide.pickle", "wb") as handle:
        pickle.dump({"train": np.array([2, 0]), "val": np.array([1]), "test": np.array([3])}, handle)


def test_original_csv_layout_with_converter(tmp_path):
    _write_original(tmp_path / "peptides-functional")
    options = {"smiles2graph": _fake_smiles2graph}
    train = lrgb_dataset(tmp_path, "Peptides-func", "train", verify_md5=False, **options)
    assert len(train) == 2
    assert train[0].num_nodes == len("OCCCCC") and train[0].y.tolist() == [[0, 1] + [0] * 8]
    assert train[1].x[0, 0] == ord("C") and train[1].edge_index.shape == (2, 2)
    with pytest.raises(ValueError, match="MD5"):
        lrgb_dataset(tmp_path, "Peptides-func", "train", **options)


@pytest.mark.skipif(importlib.util.find_spec("ogb") is not None, reason="ogb is installed")
def test_original_csv_without_ogb_names_what_to_install(tmp_path):
    _write_original(tmp_path / "peptides-functional")
    with pytest.raises(ImportError, match="pip install ogb rdkit"):
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


def _write_pyg_copy(root, key):
    """A PyG-layout copy of ``key`` (``peptides-func`` or ``pascalvoc-sp``), raw and processed."""
    raw = root / key / "raw"
    raw.mkdir(parents=True)
    for split in ("train", "val", "test"):
        if key == "peptides-func":
            torch.save([_peptide(4, 0)], raw / f"{split}.pt")
        else:
            graph = (torch.rand(3, 14), torch.rand(2, 2), torch.tensor([[0, 1], [1, 0]]), [1, 0, 2])
            with open(raw / f"{split}.pickle", "wb") as handle:
                pickle.dump([graph], handle)
    lrgb_dataset(root, key, "train")


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize(("key", "planted", "removed"), [
    ("peptides-func", "processed/train.pt", "raw"),
    ("peptides-func", "processed/pre_transform.pt", "raw"),
    ("peptides-func", "raw/val.pt", "processed"),
    ("pascalvoc-sp", "raw/test.pickle", "processed"),
])
def test_pyg_layout_files_that_would_run_code_are_refused(tmp_path, payload, key, planted, removed):
    _write_pyg_copy(tmp_path, key)
    shutil.rmtree(tmp_path / key / removed)
    path, marker = tmp_path / key / planted, tmp_path / "marker"
    with open(path, "wb") as handle:
        (torch.save if path.suffix == ".pt" else pickle.dump)([payload(marker)], handle)
    with pytest.raises(ValueError, match=f"^{path} was not loaded: it refers to the global "):
        lrgb_dataset(tmp_path, key, "train")
    assert not marker.exists()


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
    assert not list((tmp_path / "kmipgt_cache").rglob("*.pt"))  # nothing converted
    with open(split, "wb") as handle:
        pickle.dump({"train": np.array([2.0, 0.0]), "val": [1], "test": (3,)}, handle, protocol=2)
    with pytest.raises(ValueError, match="'train' must hold integer node indices, got float64"):
        lrgb_dataset(tmp_path, "Peptides-func", "train", **options)
