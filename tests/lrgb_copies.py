"""Tiny local LRGB copies for tests: Peptides-func graphs as PyG's raw files hold them, and the original
release's CSV and split pickle."""

import csv
import gzip
import pickle
from pathlib import Path

import numpy as np
import torch

from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS


def peptide(num_nodes: int, seed: int) -> tuple[torch.Tensor, ...]:
    """One raw Peptides-func graph, a path of ``num_nodes`` atoms: ``(x [n, 9], edge_attr [E, 3],
    edge_index [2, E], y [1, 10])`` as PyG's raw ``.pt`` files hold it, each feature an id of OGB's table
    for its column (a model embeds them, and ids beyond a table are refused)."""
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.stack([torch.arange(num_nodes - 1), torch.arange(1, num_nodes)])
    edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    atoms = [torch.randint(0, size, (num_nodes,), generator=generator) for size in OGB_ATOM_DIMS]
    bonds = [torch.randint(0, size, (edge_index.size(1),), generator=generator) for size in OGB_BOND_DIMS]
    return (torch.stack(atoms, 1), torch.stack(bonds, 1),
            edge_index, torch.randint(0, 2, (1, 10), generator=generator).float())


def write_raw_peptides(root: Path, sizes: dict[str, list[int]]) -> dict[str, list[tuple[torch.Tensor, ...]]]:
    """``root/peptides-func/raw/<split>.pt``: one :func:`peptide` per entry of ``sizes[split]`` (its atom
    count, seeded by its position); returns the graphs written."""
    raw = root / "peptides-func" / "raw"
    raw.mkdir(parents=True)
    graphs = {split: [peptide(n, seed) for seed, n in enumerate(counts)] for split, counts in sizes.items()}
    for split, items in graphs.items():
        torch.save(items, raw / f"{split}.pt")
    return graphs


def write_original_peptides(folder: Path) -> None:
    """The original Peptides-func files in ``folder``: four SMILES with labels, split 2/1/1."""
    (folder / "raw").mkdir(parents=True)
    rows = [("CCO", [1] + [0] * 8 + [1]), ("CCCN", [0] * 10), ("OCCCCC", [0, 1] + [0] * 8), ("NC", [1] * 10)]
    with gzip.open(folder / "raw" / "peptide_multi_class_dataset.csv.gz", "wt", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["smiles", "peptide_seq", "labels", "identifier"])
        for i, (smiles, labels) in enumerate(rows):
            writer.writerow([smiles, "SEQ", str(labels), f"id{i}"])
    with open(folder / "splits_random_stratified_peptide.pickle", "wb") as handle:
        pickle.dump({"train": np.array([2, 0]), "val": np.array([1]), "test": np.array([3])}, handle)
