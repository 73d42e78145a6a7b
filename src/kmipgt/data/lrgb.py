"""User-supplied copies of the Long Range Graph Benchmark (LRGB), read without network.

Two layouts are accepted under ``root``:

1. PyG's ``LRGBDataset`` layout: ``<root>/<name lower-case>/raw/{train,val,test}.pt`` (Peptides,
   PCQM-Contact) or ``.pickle`` (PascalVOC-SP, COCO-SP), or already processed
   ``<root>/<name lower-case>/processed/{train,val,test}.pt``. PyG processes them offline; only its
   ``download()`` (which would run for a missing raw file, even beside processed files) becomes an error.
2. The original LRGB / GraphGPS files of Peptides-func/-struct: ``peptide_multi_class_dataset.csv.gz`` or
   ``peptide_structure_normalized_dataset.csv.gz`` plus the split pickle, in ``<root>/peptides-functional``
   (``-structural``) or its ``raw/``. SMILES become graphs with OGB's ``smiles2graph`` (needs ``ogb`` and
   ``rdkit``); the converted graphs are written once in layout 1 under the kmipgt cache and read from there.

Every file is read without running code: ``.pt`` files weights-only, pickles by an unpickler that resolves
only containers, ints, integer NumPy arrays (the split pickle) and tensors (superpixel pickles); anything
else is refused with :class:`~kmipgt.safe_load.RefusedFileError`. PyG's own readers, which fall back to the
full unpickler, only see a file after it passed.

The Peptides data is CC BY-NC 4.0 (LRGB); it is never shipped with kmipgt.
"""

from __future__ import annotations

import ast
import csv
import gzip
import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.datasets import LRGBDataset
from tqdm.auto import tqdm

from kmipgt.atomic import save_tensors
from kmipgt.data import cache
from kmipgt.logs import quiet
from kmipgt.safe_load import (
    NUMPY_ARRAY_GLOBALS,
    PLAIN_GLOBALS,
    load_processed_dataset,
    load_restricted_pickle,
    tensor_globals,
    torch_load_safely,
)

LRGB_NAMES = {name.lower(): name for name in ("Peptides-func", "Peptides-struct", "PascalVOC-SP", "COCO-SP",
                                               "PCQM-Contact")}
SPLITS = ("train", "val", "test")
PEPTIDES_STRUCT_TARGETS = (
    "Inertia_mass_a", "Inertia_mass_b", "Inertia_mass_c", "Inertia_valence_a", "Inertia_valence_b",
    "Inertia_valence_c", "length_a", "length_b", "length_c", "Spherocity", "Plane_best_fit",
)
# Original LRGB release files: (folder, csv, csv MD5, split pickle, pickle MD5 or None when unpublished here).
ORIGINAL_PEPTIDES = {
    "peptides-func": ("peptides-functional", "peptide_multi_class_dataset.csv.gz",
                      "701eb743e899f4d793f0e13c8fa5a1b4", "splits_random_stratified_peptide.pickle",
                      "5a0114bdadc80b94fc7ae974f13ef061"),
    "peptides-struct": ("peptides-structural", "peptide_structure_normalized_dataset.csv.gz",
                        "c240c1c15466b5c907c63e180fa8aa89",
                        "splits_random_stratified_peptide_structure.pickle", None),
}


class _OfflineLRGBDataset(LRGBDataset):
    """PyG's ``LRGBDataset`` that never downloads and never runs code from its files: processed files alone
    suffice, missing files raise, every file is read by the safe readers first."""

    def _download(self) -> None:
        processed = [Path(self.processed_dir) / file for file in self.processed_file_names]
        if all(path.is_file() for path in processed):
            return
        super()._download()

    def download(self) -> None:
        raise FileNotFoundError(f"LRGB raw files missing in {self.raw_dir}: {self.raw_file_names}")

    def _process(self) -> None:
        # PyG compares these two records of an earlier processing with the full unpickler.
        for name in ("pre_transform.pt", "pre_filter.pt"):
            path = Path(self.processed_dir) / name
            if path.is_file():
                torch_load_safely(path, path)
        super()._process()

    def process(self) -> None:
        # PyG reads superpixel pickles with `pickle` and .pt files with a loader that falls back to the full
        # unpickler: each file must pass the safe reader first.
        for path in map(Path, self.raw_paths):
            if path.suffix == ".pickle":
                load_restricted_pickle(path, {**PLAIN_GLOBALS, **NUMPY_ARRAY_GLOBALS, **tensor_globals(path)})
            else:
                torch_load_safely(path, path)
        super().process()

    def load(self, path: str, data_cls: type = Data) -> None:
        """``InMemoryDataset.load`` without PyG's fallback to the full unpickler (``data_cls``: the class of
        files that do not name theirs)."""
        self.data, self.slices = load_processed_dataset(path, data_cls)


def _pyg_layout_present(root: Path, key: str) -> tuple[bool, list[Path]]:
    folder = root / key
    raw_ext = "pickle" if key.endswith("-sp") else "pt"
    raw = [folder / "raw" / f"{split}.{raw_ext}" for split in SPLITS]
    processed = [folder / "processed" / f"{split}.pt" for split in SPLITS]
    present = all(path.is_file() for path in raw) or all(path.is_file() for path in processed)
    return present, raw + processed


def _find_original_peptides(root: Path, key: str) -> tuple[Path | None, Path | None, list[Path]]:
    folder, csv_name, _, split_name, _ = ORIGINAL_PEPTIDES[key]
    directories = (root / folder / "raw", root / folder, root)
    csv_paths = [directory / csv_name for directory in directories]
    split_paths = [directory / split_name for directory in directories]
    csv_path = next((path for path in csv_paths if path.is_file()), None)
    split_path = next((path for path in split_paths if path.is_file()), None)
    return csv_path, split_path, csv_paths + split_paths


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _default_smiles2graph() -> Callable[[str], dict]:
    try:
        from ogb.utils import smiles2graph
    except ImportError as error:
        raise ImportError(
            "Reading the original LRGB CSV needs OGB's smiles2graph, which needs rdkit: "
            "pip install ogb rdkit (or supply the PyG LRGBDataset raw layout instead)"
        ) from error
    return smiles2graph


def _peptides_targets(row: dict[str, str], key: str) -> torch.Tensor:
    if key == "peptides-func":
        return torch.tensor([ast.literal_eval(row["labels"])], dtype=torch.float)
    return torch.tensor([[float(row[name]) for name in PEPTIDES_STRUCT_TARGETS]], dtype=torch.float)


def _load_split_pickle(path: Path) -> dict[str, Any]:
    """The LRGB split pickle (``{"train": indices, "val": ..., "test": ...}``), read by an unpickler that
    resolves only built-in containers, ints and NumPy arrays; RefusedFileError for anything else, ValueError
    for arrays that are not integer."""
    split_index = load_restricted_pickle(path, {**PLAIN_GLOBALS, **NUMPY_ARRAY_GLOBALS})
    if not isinstance(split_index, dict) or not set(SPLITS) <= set(split_index):
        raise ValueError(f"{path} is not an LRGB split file (expected a dict with keys {SPLITS})")
    for split in SPLITS:
        indices = np.asarray(split_index[split])
        if indices.size and indices.dtype.kind not in "iu":
            raise ValueError(f"{path}: split {split!r} must hold integer node indices, got {indices.dtype}")
    return split_index


def convert_original_peptides(
    csv_path: Path, split_path: Path, key: str, out_root: Path, smiles2graph: Callable[[str], dict]
) -> Path:
    """Write ``<out_root>/<key>/raw/{train,val,test}.pt`` (PyG layout) from the original CSV and splits."""
    with gzip.open(csv_path, "rt", newline="") as handle:
        rows = list(csv.DictReader(handle))
    split_index = _load_split_pickle(split_path)
    graphs = []
    for row in tqdm(rows, desc=f"{key}: SMILES to graphs", unit="graph", disable=quiet()):
        graph = smiles2graph(row["smiles"])
        graphs.append((
            torch.from_numpy(graph["node_feat"]).long(), torch.from_numpy(graph["edge_feat"]).long(),
            torch.from_numpy(graph["edge_index"]).long(), _peptides_targets(row, key),
        ))
    raw_dir = out_root / key / "raw"
    raw_dir.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        save_tensors([graphs[int(i)] for i in split_index[split]], raw_dir / f"{split}.pt")
    return out_root


def lrgb_dataset(
    root: str | Path,
    name: str,
    split: str = "train",
    *,
    transform: Callable[[Data], Data] | None = None,
    smiles2graph: Callable[[str], dict] | None = None,
    verify_md5: bool = True,
) -> LRGBDataset:
    """One split of an LRGB dataset from a local copy, as a PyG ``LRGBDataset`` (processed offline).

    Args:
        root: directory holding the copy (layouts in the module docstring).
        name: ``Peptides-func``, ``Peptides-struct``, ``PascalVOC-SP``, ``COCO-SP`` or ``PCQM-Contact``.
        split: ``train``, ``val`` or ``test``.
        transform: applied to each graph on access (e.g. a positional encoding).
        smiles2graph: SMILES -> OGB graph dict, for the original CSV layout (default: ``ogb.utils``).
        verify_md5: check original CSV / split files against the published MD5 sums.
    """
    key = name.lower()
    if key not in LRGB_NAMES:
        raise ValueError(f"name must be one of {sorted(LRGB_NAMES.values())}, got {name!r}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    root = Path(root)
    present, tried = _pyg_layout_present(root, key)
    if present:
        return _OfflineLRGBDataset(str(root), key, split, transform=transform)
    if key in ORIGINAL_PEPTIDES:
        csv_path, split_path, original_tried = _find_original_peptides(root, key)
        tried += original_tried
        if csv_path is not None and split_path is not None:
            return _from_original(csv_path, split_path, key, split, transform, smiles2graph, verify_md5)
    listing = "\n  ".join(str(path) for path in tried)
    raise FileNotFoundError(f"No local copy of {LRGB_NAMES[key]} under {root}. Looked for:\n  {listing}")


def lrgb_splits(root: str | Path, name: str, **options) -> dict[str, list[Data]]:
    """Every split of a local LRGB copy as a list of graphs; ``options`` as for :func:`lrgb_dataset`."""
    return {split: list(lrgb_dataset(root, name, split, **options)) for split in SPLITS}


def _from_original(csv_path, split_path, key, split, transform, smiles2graph, verify_md5) -> LRGBDataset:
    _, _, csv_md5, _, split_md5 = ORIGINAL_PEPTIDES[key]
    if verify_md5:
        for path, expected in ((csv_path, csv_md5), (split_path, split_md5)):
            if expected is not None and _md5(path) != expected:
                raise ValueError(f"{path} has MD5 {_md5(path)}, expected {expected} (the LRGB release); "
                                 "pass verify_md5=False to use a modified copy")
    converted = hashlib.sha256(csv_path.read_bytes() + split_path.read_bytes()).hexdigest()[:32]
    out_root = cache.cache_dir() / "lrgb" / converted
    if not _pyg_layout_present(out_root, key)[0]:
        converter = smiles2graph or _default_smiles2graph()
        convert_original_peptides(csv_path, split_path, key, out_root, converter)
    return _OfflineLRGBDataset(str(out_root), key, split, transform=transform)
