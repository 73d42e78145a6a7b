"""User-supplied copies of the Long Range Graph Benchmark (LRGB), read without network.

Two layouts are accepted under ``root``:

1. PyG's ``LRGBDataset`` layout: ``<root>/<name lower-case>/raw/{train,val,test}.pt`` (Peptides,
   PCQM-Contact) or ``.pickle`` (PascalVOC-SP, COCO-SP), or already processed
   ``<root>/<name lower-case>/processed/{train,val,test}.pt`` (read in preference to the raw files).
2. The original LRGB / GraphGPS files of Peptides-func/-struct: ``peptide_multi_class_dataset.csv.gz`` or
   ``peptide_structure_normalized_dataset.csv.gz`` plus the split pickle, in ``<root>/peptides-functional``
   (``-structural``) or its ``raw/``. SMILES become graphs with OGB's ``smiles2graph`` (needs ``ogb`` and
   ``rdkit``); the converted graphs are written once in layout 1 under the kmipgt cache and read from there.

Each file of a split is read once, by a reader that runs no code: ``.pt`` files weights-only, pickles by an
unpickler that resolves only containers, ints, integer NumPy arrays (the split pickle) and tensors
(superpixel pickles); anything else is refused with :class:`~kmipgt.safe_load.RefusedFileError`. The
graphs are built from what was read, as PyG's processing builds them, and checked (edge lists of two
integer rows with ids of the graph's own nodes, integer class ids) with the file named in any error. PyG's
``LRGBDataset`` is never handed the folder: it would read each file again with a loader that falls back to
the full unpickler, and write its processed files into the copy. Nothing is written into the copy.

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
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.datasets import LRGBDataset
from tqdm.auto import tqdm

from kmipgt.atomic import save_tensors
from kmipgt.data import cache
from kmipgt.data.graph_checks import MAX_CLASSES, check_class_labels, check_edge_index, check_graph_edges
from kmipgt.data.registry import NUMERIC_FEATURES, CategoricalFeatures
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
# The number of values of each atom / bond feature of OGB's smiles2graph (ogb.utils.features'
# get_atom_feature_dims and get_bond_feature_dims): the molecules' features are these category ids.
OGB_ATOM_DIMS = (119, 5, 12, 12, 10, 6, 6, 2, 2)
OGB_BOND_DIMS = (5, 6, 2)
MOLECULES = ("peptides-func", "peptides-struct", "pcqm-contact")
# What each raw graph of a dataset holds, in order (PyG's LRGBDataset.process reads the same tuples).
RAW_FIELDS = {
    "pcqm-contact": ("x", "edge_attr", "edge_index", "edge_label_index", "edge_label"),
    **dict.fromkeys(("peptides-func", "peptides-struct", "pascalvoc-sp", "coco-sp"),
                    ("x", "edge_attr", "edge_index", "y")),
}


class LRGBSplit(InMemoryDataset):
    """One split of a local LRGB copy, held in memory: the collated graphs ``data`` and their ``slices``
    (as ``InMemoryDataset.collate`` gives them: None for one graph), ``transform`` applied on access;
    nothing is downloaded, written or read again."""

    def __init__(self, data: Data, slices: dict[str, torch.Tensor] | None, name: str, split: str,
                 transform: Callable[[Data], Data] | None = None) -> None:
        super().__init__(None, transform)
        self.name, self.split = name, split
        self._data, self.slices = data, slices

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.name}, {self.split}, {len(self)} graphs)"


def _coco_labels() -> torch.Tensor:
    """COCO-SP's label ids (COCO's category ids, not contiguous) to 0..80, as a table over every class id
    :func:`~kmipgt.data.graph_checks.check_class_labels` lets through; -1 for the ids COCO does not use."""
    # PyG's remapping reads nothing from its dataset, so it is called without one.
    mapping = LRGBDataset.label_remap_coco(None)
    table = torch.full((MAX_CLASSES,), -1, dtype=torch.long)
    table[list(mapping)] = torch.tensor(list(mapping.values()))
    return table


def _raw_graph(item: Any, key: str, where: str) -> Data:
    """The graph of one raw tuple, built as PyG's processing builds it, after checking what it holds."""
    fields = RAW_FIELDS[key]
    if not isinstance(item, (tuple, list)) or len(item) != len(fields) or not all(
            isinstance(value, torch.Tensor) for value in item[:3]):
        raise ValueError(f"{where} must be a tuple of tensors ({', '.join(fields)})")
    values = dict(zip(fields, item, strict=True))
    x = values["x"]
    if x.dim() != 2:
        raise ValueError(f"{where}: x must have shape [N, F], got {list(x.shape)}")
    values["edge_index"] = check_edge_index(values["edge_index"], x.size(0), f"{where}: edge_index")
    if key == "pcqm-contact":
        values["edge_label_index"] = check_edge_index(values["edge_label_index"], x.size(0),
                                                      f"{where}: edge_label_index")
    elif key.endswith("-sp"):  # superpixels: float features, a class per node
        values["x"], values["edge_attr"] = x.float(), values["edge_attr"].float()
        labels = values["y"] if isinstance(values["y"], torch.Tensor) else torch.as_tensor(values["y"])
        values["y"] = check_class_labels(labels, f"{where}: y", count=x.size(0))
    return Data(**values)


def _read_raw(path: Path, key: str) -> list[Data]:
    """The graphs of one raw split file, read once by the safe reader."""
    if path.suffix == ".pickle":
        items = load_restricted_pickle(path, {**PLAIN_GLOBALS, **NUMPY_ARRAY_GLOBALS, **tensor_globals(path)})
    else:
        items = torch_load_safely(path, path)
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(f"{path} must hold a non-empty list of graphs, got {type(items).__name__}")
    graphs = [_raw_graph(item, key, f"{path}: graph {index}") for index, item in enumerate(items)]
    if key == "coco-sp":
        table = _coco_labels()
        for index, graph in enumerate(graphs):
            unknown = graph.y[table[graph.y] < 0]
            if unknown.numel():
                raise ValueError(f"{path}: graph {index}: y holds {int(unknown[0])}, which is no COCO "
                                 "category")
            graph.y = table[graph.y]
    return graphs


def _read_processed(path: Path) -> tuple[Data, dict[str, torch.Tensor] | None]:
    """The collated graphs and slices (None for a split of one graph) of one processed split file, read once
    and checked."""
    data, slices = load_processed_dataset(path)
    x = data.get("x")
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or data.get("edge_index") is None:
        raise ValueError(f"{path} is not a processed LRGB split: it has no x of shape [N, F] and edge_index")
    for name in ("edge_index", "edge_label_index"):
        if data.get(name) is None:
            continue
        if slices is None:
            data[name] = check_edge_index(data[name], x.size(0), f"{path}: {name}")
        elif isinstance(slices, dict) and {"x", name} <= set(slices):
            data[name] = check_graph_edges(data[name], slices[name], slices["x"], f"{path}: {name}")
        else:
            raise ValueError(f"{path} is not a processed LRGB split: it has no slices of x and {name}")
    return data, slices


def _split(folder: Path, key: str, split: str, transform: Callable[[Data], Data] | None) -> LRGBSplit:
    """``split`` of the PyG-layout copy in ``folder``: the processed files where all three are present,
    else the raw ones."""
    processed = [folder / "processed" / f"{name}.pt" for name in SPLITS]
    if all(path.is_file() for path in processed):
        data, slices = _read_processed(folder / "processed" / f"{split}.pt")
    else:
        raw_ext = "pickle" if key.endswith("-sp") else "pt"
        data, slices = InMemoryDataset.collate(_read_raw(folder / "raw" / f"{split}.{raw_ext}", key))
    return LRGBSplit(data, slices, LRGB_NAMES[key], split, transform)


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
) -> LRGBSplit:
    """One split of an LRGB dataset from a local copy, as an in-memory PyG dataset (:class:`LRGBSplit`).

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
        return _split(root / key, key, split, transform)
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


def lrgb_categories(root: str | Path, name: str, **options: Any) -> CategoricalFeatures:
    """Which features of LRGB's ``name`` are category ids (arguments as :func:`lrgb_splits`): the molecules'
    (Peptides, PCQM-Contact) atom and bond features are OGB's; the superpixels' are numbers."""
    key = name.lower()
    if key not in LRGB_NAMES:
        raise ValueError(f"name must be one of {sorted(LRGB_NAMES.values())}, got {name!r}")
    return CategoricalFeatures(OGB_ATOM_DIMS, OGB_BOND_DIMS) if key in MOLECULES else NUMERIC_FEATURES


def _from_original(csv_path, split_path, key, split, transform, smiles2graph, verify_md5) -> LRGBSplit:
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
    return _split(out_root / key, key, split, transform)
