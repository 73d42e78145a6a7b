"""The original Peptides release converted by worker processes into one compact cache file, read back as the
converter gave it and checked as read."""

import csv
import gzip
import logging
import pickle
import shutil
import zipfile

import numpy as np
import pytest
import torch

from kmipgt.data import lrgb_dataset, lrgb_splits
from kmipgt.data.peptides import CHUNK_ROWS, convert_peptides

ROWS = 2 * CHUNK_ROWS + 37  # three chunks for the workers, the last one short


def _smiles2graph(smiles):
    """Stand-in for OGB's converter: a ring of one atom per character, ids drawn from the string."""
    n = len(smiles)
    generator = np.random.default_rng(sum(map(ord, smiles)))
    ring = np.stack([np.arange(n), (np.arange(n) + 1) % n])
    edges = np.concatenate([ring, ring[::-1]], axis=1)
    return {"num_nodes": n, "node_feat": generator.integers(0, 119, (n, 9)),
            "edge_feat": generator.integers(0, 5, (edges.shape[1], 3)), "edge_index": edges}


def _release(folder, rows=ROWS):
    """A Peptides-func release of ``rows`` molecules; the split pickle lists them out of order."""
    folder.mkdir(parents=True)
    labels = [[(i + j) % 2 for j in range(10)] for i in range(rows)]
    with gzip.open(folder / "peptide_multi_class_dataset.csv.gz", "wt", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["smiles", "peptide_seq", "labels", "identifier"])
        for i in range(rows):
            writer.writerow(["C" * (3 + i % 7) + "N" * (i % 3), "SEQ", str(labels[i]), f"id{i}"])
    order = np.random.default_rng(0).permutation(rows)
    quarter = rows // 4
    ends = (2 * quarter, 3 * quarter)
    split = {"train": order[: ends[0]], "val": order[ends[0]: ends[1]], "test": order[ends[1]:]}
    with open(folder / "splits_random_stratified_peptide.pickle", "wb") as handle:
        pickle.dump(split, handle)
    return split, labels


def _files(folder):
    return folder / "peptide_multi_class_dataset.csv.gz", folder / "splits_random_stratified_peptide.pickle"


def test_the_release_becomes_one_compact_file_read_back_as_converted(tmp_path):
    split, labels = _release(tmp_path / "peptides-functional")
    splits = lrgb_splits(tmp_path, "Peptides-func", smiles2graph=_smiles2graph, verify_md5=False)
    [cached] = [path for path in (tmp_path / "kmipgt_cache" / "lrgb").rglob("*") if path.is_file()]
    assert cached.suffix == ".npz"  # one file, no raw and processed copies
    with zipfile.ZipFile(cached) as members:  # compressed, so that it travels to machines without rdkit
        assert {member.compress_type for member in members.infolist()} == {zipfile.ZIP_DEFLATED}
    with np.load(cached) as stored:
        assert stored["x"].dtype == np.uint8 and stored["edge_attr"].dtype == np.uint8
        assert stored["edge_index"].dtype == np.uint16
    for name, graphs in splits.items():
        one_by_one = list(lrgb_dataset(tmp_path, "Peptides-func", name, smiles2graph=_smiles2graph,
                                       verify_md5=False))
        assert len(graphs) == len(one_by_one) == len(split[name])
        for graph, indexed in zip(graphs, one_by_one, strict=True):
            keys = graph.keys()
            assert keys == indexed.keys() and all(torch.equal(graph[key], indexed[key]) for key in keys)
        for row, graph in zip(split[name], graphs, strict=True):
            smiles = "C" * (3 + row % 7) + "N" * (row % 3)
            expected = _smiles2graph(smiles)
            assert torch.equal(graph.x, torch.from_numpy(expected["node_feat"]).to(torch.uint8))
            assert torch.equal(graph.edge_attr, torch.from_numpy(expected["edge_feat"]).to(torch.uint8))
            assert torch.equal(graph.edge_index, torch.from_numpy(expected["edge_index"]))
            assert graph.y.tolist() == [labels[row]]


def test_a_cache_carried_to_another_machine_needs_no_converter_there(tmp_path, monkeypatch):
    _release(tmp_path / "peptides-functional")
    here = lrgb_splits(tmp_path, "Peptides-func", smiles2graph=_smiles2graph, verify_md5=False)
    carried = tmp_path / "carried_cache"
    shutil.copytree(tmp_path / "kmipgt_cache", carried)
    monkeypatch.setenv("KMIPGT_CACHE", str(carried))

    def no_converter(smiles):
        raise AssertionError("converted again")

    there = lrgb_splits(tmp_path, "Peptides-func", smiles2graph=no_converter, verify_md5=False)
    for name, graphs in here.items():
        for graph, read in zip(graphs, there[name], strict=True):
            assert all(torch.equal(value, read[key]) for key, value in graph)


def test_workers_convert_as_one_process_does(tmp_path, caplog):
    _release(tmp_path / "copy")
    one = convert_peptides(*_files(tmp_path / "copy"), "peptides-func", _smiles2graph, num_workers=1)
    with caplog.at_level(logging.WARNING):
        many = convert_peptides(*_files(tmp_path / "copy"), "peptides-func", _smiles2graph, num_workers=1000)
    assert "num_workers: 1000 is more than the" in caplog.text  # capped at the CPUs this process may use
    assert one.keys() == many.keys()
    for name in one:
        assert one[name].dtype == many[name].dtype and np.array_equal(one[name], many[name])
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        convert_peptides(*_files(tmp_path / "copy"), "peptides-func", _smiles2graph, num_workers=0)


def test_ids_that_do_not_fit_the_compact_types_are_refused(tmp_path):
    _release(tmp_path / "copy", rows=4)

    def wide_atoms(smiles):
        graph = _smiles2graph(smiles)
        graph["node_feat"][0, 0] = 300
        return graph

    with pytest.raises(ValueError, match=r"SMILES of row 0: x must hold integer ids in \[0, 255\], got int64 "
                                         r"values in \[0, 300\]"):
        convert_peptides(*_files(tmp_path / "copy"), "peptides-func", wide_atoms, num_workers=1)


def test_the_cached_file_is_checked_as_read(tmp_path):
    _release(tmp_path / "peptides-functional", rows=8)
    options = {"smiles2graph": _smiles2graph, "verify_md5": False}
    lrgb_splits(tmp_path, "Peptides-func", **options)
    [cached] = list((tmp_path / "kmipgt_cache").rglob("*.npz"))
    with np.load(cached) as stored:
        arrays = {name: stored[name] for name in stored.files}
    arrays["edge_index"][1, arrays["edge_ptr"][2]] = 60  # graph 2 has fewer nodes
    np.savez(cached, **arrays)
    message = rf"^{cached}: edge_index of graph 2 must hold node ids in \[0, \d+\)"
    with pytest.raises(ValueError, match=message):
        lrgb_splits(tmp_path, "Peptides-func", **options)
