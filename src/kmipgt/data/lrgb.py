"""User-supplied copies of the Long Range Graph Benchmark (LRGB), read without network.

Two layouts are accepted under ``root``:

1. PyG's ``LRGBDataset`` layout: ``<root>/<name lower-case>/raw/{train,val,test}.pt`` (Peptides,
   PCQM-Contact) or ``.pickle`` (PascalVOC-SP, COCO-SP), or already processed
   ``<root>/<name lower-case>/processed/{train,val,test}.pt`` (read in preference to the raw files).
2. The original LRGB / GraphGPS files of Peptides-func/-struct: ``peptide_multi_class_dataset.csv.gz`` or
   ``peptide_structure_normalized_dataset.csv.gz`` plus the split pickle, in ``<root>/peptides-functional``
   (``-structural``) or its ``raw/``. SMILES become graphs with OGB's ``smiles2graph`` (needs ``ogb`` and
   ``rdkit``) in worker processes, written once as one compact file in the kmipgt cache and read from there
   (:mod:`kmipgt.data.peptides`).

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

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.datasets import LRGBDataset

from kmipgt.data.graph_checks import MAX_CLASSES, check_class_labels, check_edge_index, check_graph_edges
from kmipgt.data.peptides import ORIGINAL_PEPTIDES, find_original_peptides, peptides_splits
from kmipgt.data.registry import NUMERIC_FEATURES, CategoricalFeatures
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

    def graphs(self) -> list[Data]:
        """Every graph, as ``list(self)`` gives them, cut from the collated tensors in one pass (indexing
        the dataset graph by graph takes about three times as long: 15,535 Peptides in seconds)."""
        if self.slices is None:
            graphs = [self._data]
        else:
            bounds = {key: offsets.tolist() for key, offsets in self.slices.items()}
            dims = {key: self._data.__cat_dim__(key, self._data[key]) for key in bounds}
            graphs = [
                Data(**{key: self._data[key].narrow(dims[key], ends[i], ends[i + 1] - ends[i])
                        for key, ends in bounds.items()})
                for i in range(len(self))
            ]
        return graphs if self.transform is None else [self.transform(graph) for graph in graphs]

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


def lrgb_dataset(
    root: str | Path,
    name: str,
    split: str = "train",
    *,
    transform: Callable[[Data], Data] | None = None,
    smiles2graph: Callable[[str], dict] | None = None,
    verify_md5: bool = True,
    num_workers: int | None = None,
) -> LRGBSplit:
    """One split of an LRGB dataset from a local copy, as an in-memory PyG dataset (:class:`LRGBSplit`).

    Args:
        root: directory holding the copy (layouts in the module docstring).
        name: ``Peptides-func``, ``Peptides-struct``, ``PascalVOC-SP``, ``COCO-SP`` or ``PCQM-Contact``.
        split: ``train``, ``val`` or ``test``.
        transform: applied to each graph on access (e.g. a positional encoding).
        smiles2graph: SMILES -> OGB graph dict, for the original CSV layout (default: ``ogb.utils``).
        verify_md5: check original CSV / split files against the published MD5 sums.
        num_workers: processes converting the original CSV layout's SMILES, once (default, and at most: one
            per CPU this process may use).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    options = {"smiles2graph": smiles2graph, "verify_md5": verify_md5, "num_workers": num_workers}
    return _lrgb_splits(root, name, (split,), transform, options)[split]


def lrgb_splits(
    root: str | Path,
    name: str,
    *,
    transform: Callable[[Data], Data] | None = None,
    smiles2graph: Callable[[str], dict] | None = None,
    verify_md5: bool = True,
    num_workers: int | None = None,
) -> dict[str, list[Data]]:
    """Every split of a local LRGB copy as a list of graphs; arguments as for :func:`lrgb_dataset` (an
    original Peptides copy is read once for all three)."""
    options = {"smiles2graph": smiles2graph, "verify_md5": verify_md5, "num_workers": num_workers}
    splits = _lrgb_splits(root, name, SPLITS, transform, options)
    return {split: dataset.graphs() for split, dataset in splits.items()}


def _lrgb_splits(
    root: str | Path, name: str, splits: tuple[str, ...], transform: Callable[[Data], Data] | None,
    original: dict[str, Any],
) -> dict[str, LRGBSplit]:
    """``splits`` of the copy under ``root``: its PyG layout, else the original Peptides release (read with
    ``original``, the keyword options of :func:`~kmipgt.data.peptides.peptides_splits`)."""
    key = name.lower()
    if key not in LRGB_NAMES:
        raise ValueError(f"name must be one of {sorted(LRGB_NAMES.values())}, got {name!r}")
    root = Path(root)
    present, tried = _pyg_layout_present(root, key)
    if present:
        return {split: _split(root / key, key, split, transform) for split in splits}
    if key in ORIGINAL_PEPTIDES:
        csv_path, split_path, original_tried = find_original_peptides(root, key)
        tried += original_tried
        if csv_path is not None and split_path is not None:
            read = peptides_splits(csv_path, split_path, key, **original)
            return {split: LRGBSplit(*read[split], LRGB_NAMES[key], split, transform) for split in splits}
    listing = "\n  ".join(str(path) for path in tried)
    raise FileNotFoundError(f"No local copy of {LRGB_NAMES[key]} under {root}. Looked for:\n  {listing}")


def lrgb_categories(root: str | Path, name: str, **options: Any) -> CategoricalFeatures:
    """Which features of LRGB's ``name`` are category ids (arguments as :func:`lrgb_splits`): the molecules'
    (Peptides, PCQM-Contact) atom and bond features are OGB's; the superpixels' are numbers."""
    key = name.lower()
    if key not in LRGB_NAMES:
        raise ValueError(f"name must be one of {sorted(LRGB_NAMES.values())}, got {name!r}")
    return CategoricalFeatures(OGB_ATOM_DIMS, OGB_BOND_DIMS) if key in MOLECULES else NUMERIC_FEATURES
