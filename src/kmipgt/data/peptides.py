"""The original LRGB release of Peptides-func/-struct (a CSV of SMILES and a split pickle), converted once
into one compact file in the kmipgt cache.

The conversion runs OGB's ``smiles2graph`` (which needs ``ogb`` and ``rdkit``) over the rows in worker
processes, one per CPU this process may use unless told otherwise. The result is one ``.npz`` of the graphs
in split order (train, val, test, each in the split pickle's order), in a few arrays:

- ``x`` uint8 ``[N, 9]`` and ``edge_attr`` uint8 ``[E, 3]``: OGB's atom and bond category ids (at most 119
  values per column);
- ``edge_index`` uint16 ``[2, E]``: each graph's own node ids, counted from its first node (a peptide has a
  few hundred atoms);
- ``node_ptr``, ``edge_ptr`` int64 ``[G + 1]``: where each graph's nodes and edges start;
- ``y`` float32 ``[G, T]``: the targets; ``split_sizes`` int64 ``[3]``: the graphs of each split.

For Peptides-func that is about 4 MB (compressed) for the 7.5 MB CSV. It is read back without running code
(``allow_pickle=False``), its graphs are checked as read (offsets, node ids of the graph's own nodes), and
each split becomes ``InMemoryDataset``'s collated graphs and slices without per-graph work.
"""

from __future__ import annotations

import ast
import csv
import gzip
import hashlib
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from tqdm.auto import tqdm

from kmipgt.cpus import capped_at_cpus
from kmipgt.data import cache
from kmipgt.data.graph_checks import check_graph_edges
from kmipgt.logs import quiet
from kmipgt.safe_load import NUMPY_ARRAY_GLOBALS, PLAIN_GLOBALS, load_restricted_pickle

__all__ = ["ORIGINAL_PEPTIDES", "find_original_peptides", "peptides_splits"]

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
# Rows per task handed to a worker: small enough for a moving bar and even load, large enough that the
# hand-over costs nothing beside rdkit.
CHUNK_ROWS = 256
# The compact types and the largest value each holds.
ID_TYPES = {"x": (np.uint8, 255), "edge_attr": (np.uint8, 255), "edge_index": (np.uint16, 65_535)}

Converter = Callable[[str], dict]
Splits = dict[str, tuple[Data, dict[str, torch.Tensor]]]


def find_original_peptides(root: Path, key: str) -> tuple[Path | None, Path | None, list[Path]]:
    """The CSV and split pickle of ``key`` under ``root`` (None where absent), and every path tried."""
    folder, csv_name, _, split_name, _ = ORIGINAL_PEPTIDES[key]
    directories = (root / folder / "raw", root / folder, root)
    csv_paths = [directory / csv_name for directory in directories]
    split_paths = [directory / split_name for directory in directories]
    csv_path = next((path for path in csv_paths if path.is_file()), None)
    split_path = next((path for path in split_paths if path.is_file()), None)
    return csv_path, split_path, csv_paths + split_paths


def _default_smiles2graph() -> Converter:
    try:
        from ogb.utils import smiles2graph
    except ImportError as error:
        raise ImportError(
            "Reading the original LRGB CSV needs OGB's smiles2graph, which needs rdkit: "
            "pip install 'kmipgt[lrgb]' (or supply the PyG LRGBDataset raw layout instead)"
        ) from error
    return smiles2graph


def _targets(row: dict[str, str], key: str) -> list[float]:
    if key == "peptides-func":
        return [float(label) for label in ast.literal_eval(row["labels"])]
    return [float(row[name]) for name in PEPTIDES_STRUCT_TARGETS]


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


def _compact(values: Any, name: str, where: str) -> np.ndarray:
    """``values`` in its compact type (:data:`ID_TYPES`), after checking that every value fits it."""
    array = np.asarray(values)
    dtype, largest = ID_TYPES[name]
    if array.size and (array.dtype.kind not in "iu" or array.min() < 0 or array.max() > largest):
        raise ValueError(f"{where}: {name} must hold integer ids in [0, {largest}], got {array.dtype} "
                         f"values in [{array.min()}, {array.max()}]")
    return array.astype(dtype)


def _graph(smiles: str, row: int, convert: Converter) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The compact ``x``, ``edge_attr`` and ``edge_index`` of one SMILES string (``row`` of the CSV)."""
    graph = convert(smiles)
    where = f"SMILES of row {row}"
    x = _compact(graph["node_feat"], "x", where)
    edge_attr = _compact(graph["edge_feat"], "edge_attr", where)
    edge_index = _compact(graph["edge_index"], "edge_index", where).reshape(2, -1)
    if x.ndim != 2 or x.shape[0] == 0 or edge_attr.ndim != 2 or edge_attr.shape[0] != edge_index.shape[1]:
        raise ValueError(f"{where}: a graph of [N, F] atoms (N >= 1) and [E, F'] bonds for [2, E] edges was "
                         f"expected, got {x.shape}, {edge_attr.shape}, {edge_index.shape}")
    return x, edge_attr, edge_index


_WORKER_CONVERTER: Converter | None = None


def _init_worker(convert: Converter) -> None:
    global _WORKER_CONVERTER
    _WORKER_CONVERTER = convert


def _convert_chunk(
    chunk: tuple[int, list[str]], convert: Converter
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The compact graphs of a chunk of SMILES strings, the first from row ``chunk[0]``."""
    first, smiles = chunk
    return [_graph(text, first + i, convert) for i, text in enumerate(smiles)]


def _worker_chunk(chunk: tuple[int, list[str]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return _convert_chunk(chunk, _WORKER_CONVERTER)


def _convert_rows(
    smiles: list[str], convert: Converter, workers: int, desc: str
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each SMILES string's compact graph, in order, converted by ``workers`` processes."""
    chunks = [(start, smiles[start:start + CHUNK_ROWS]) for start in range(0, len(smiles), CHUNK_ROWS)]
    bar = tqdm(total=len(smiles), desc=desc, unit="graph", disable=quiet())
    graphs = []
    if workers == 1:
        for chunk in chunks:
            graphs += _convert_chunk(chunk, convert)
            bar.update(len(chunk[1]))
    else:
        # fork: the converter (any callable) is inherited, not pickled; workers touch rdkit and NumPy only,
        # never torch, whose threads a fork does not carry over.
        start_method = "fork" if "fork" in multiprocessing.get_all_start_methods() else None
        context = multiprocessing.get_context(start_method)
        with context.Pool(workers, initializer=_init_worker, initargs=(convert,)) as pool:
            for result in pool.imap(_worker_chunk, chunks):
                graphs += result
                bar.update(len(result))
    bar.close()
    return graphs


def convert_peptides(
    csv_path: Path, split_path: Path, key: str, convert: Converter, num_workers: int | None = None
) -> dict[str, np.ndarray]:
    """The compact arrays (module docstring) of the release's CSV and split pickle, converted by
    ``num_workers`` processes (default, and at most: one per CPU this process may use)."""
    if num_workers is not None and num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    split_index = _load_split_pickle(split_path)
    with gzip.open(csv_path, "rt", newline="") as handle:
        rows = list(csv.DictReader(handle))
    order = np.concatenate([np.asarray(split_index[split], dtype=np.int64).reshape(-1) for split in SPLITS])
    if order.size and (order.min() < 0 or order.max() >= len(rows)):
        raise ValueError(f"{split_path} must index the {len(rows)} rows of {csv_path}, got indices in "
                         f"[{order.min()}, {order.max()}]")
    workers = capped_at_cpus(num_workers, "num_workers")
    graphs = _convert_rows([rows[i]["smiles"] for i in order], convert, workers, f"{key}: SMILES to graphs")
    counts = [(g[0].shape[0], g[2].shape[1]) for g in graphs]
    return {
        "x": np.concatenate([g[0] for g in graphs]),
        "edge_attr": np.concatenate([g[1] for g in graphs]),
        "edge_index": np.concatenate([g[2] for g in graphs], axis=1),
        "node_ptr": np.concatenate([[0], np.cumsum([n for n, _ in counts])]).astype(np.int64),
        "edge_ptr": np.concatenate([[0], np.cumsum([e for _, e in counts])]).astype(np.int64),
        "y": np.asarray([_targets(rows[i], key) for i in order], dtype=np.float32),
        "split_sizes": np.asarray([np.asarray(split_index[s]).size for s in SPLITS], dtype=np.int64),
    }


def _offsets(arrays: dict[str, np.ndarray], name: str, total: int, where: str) -> torch.Tensor:
    """``arrays[name]`` as int64 offsets ``[G + 1]`` from 0 to ``total``, never decreasing."""
    ptr = arrays[name]
    if ptr.ndim != 1 or ptr.dtype != np.int64 or ptr.size == 0 or ptr[0] != 0 or ptr[-1] != total or (
            np.diff(ptr) < 0).any():
        raise ValueError(f"{where}: {name} must be int64 offsets from 0 to {total}, never decreasing")
    return torch.from_numpy(ptr)


def splits_from_arrays(arrays: dict[str, np.ndarray], where: str) -> Splits:
    """Each split's collated graphs and slices (as ``InMemoryDataset.collate`` gives them) from the compact
    arrays, checked first; ``where`` names their file in errors."""
    expected = {"x", "edge_attr", "edge_index", "node_ptr", "edge_ptr", "y", "split_sizes"}
    missing = sorted(expected - set(arrays))
    if missing:
        raise ValueError(f"{where} is not a converted Peptides file: it has no {', '.join(missing)}")
    x, edge_attr, y = (torch.from_numpy(arrays[name]) for name in ("x", "edge_attr", "y"))
    node_ptr = _offsets(arrays, "node_ptr", x.shape[0], where)
    edge_ptr = _offsets(arrays, "edge_ptr", arrays["edge_index"].shape[-1], where)
    edge_index = check_graph_edges(
        torch.from_numpy(arrays["edge_index"].astype(np.int64)), edge_ptr, node_ptr, f"{where}: edge_index"
    )
    sizes = arrays["split_sizes"]
    graphs = node_ptr.numel() - 1
    if sizes.shape != (3,) or sizes.min() < 0 or sizes.sum() != graphs or y.shape[0] != graphs or \
            edge_attr.shape[0] != edge_index.shape[1]:
        raise ValueError(f"{where}: its {graphs} graphs do not match its targets, bonds and split sizes")
    splits, first = {}, 0
    for split, size in zip(SPLITS, sizes.tolist(), strict=True):
        last = first + size
        nodes, edges = node_ptr[first:last + 1], edge_ptr[first:last + 1]
        data = Data(x=x[nodes[0]:nodes[-1]], edge_index=edge_index[:, edges[0]:edges[-1]],
                    edge_attr=edge_attr[edges[0]:edges[-1]], y=y[first:last])
        edge_slices = edges - edges[0]
        splits[split] = (data, {"x": nodes - nodes[0], "edge_index": edge_slices, "edge_attr": edge_slices,
                                "y": torch.arange(size + 1)})
        first = last
    return splits


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def peptides_splits(
    csv_path: Path, split_path: Path, key: str, *, smiles2graph: Converter | None = None,
    verify_md5: bool = True, num_workers: int | None = None,
) -> Splits:
    """Every split of the original release's ``key`` (``peptides-func`` or ``peptides-struct``) as collated
    graphs and slices: converted once (:func:`convert_peptides`) into the kmipgt cache, then read from there.

    ``verify_md5``: check both files against the published MD5 sums first.
    """
    _, _, csv_md5, _, split_md5 = ORIGINAL_PEPTIDES[key]
    if verify_md5:
        for path, expected in ((csv_path, csv_md5), (split_path, split_md5)):
            if expected is not None and _md5(path) != expected:
                raise ValueError(f"{path} has MD5 {_md5(path)}, expected {expected} (the LRGB release); "
                                 "pass verify_md5=False to use a modified copy")
    release = hashlib.sha256(csv_path.read_bytes() + split_path.read_bytes()).hexdigest()[:32]
    name = f"lrgb/{release}/{key}-compact"
    arrays = cache.load_arrays(name)
    if arrays is None:
        converter = smiles2graph or _default_smiles2graph()
        arrays = convert_peptides(csv_path, split_path, key, converter, num_workers)
        cache.save_arrays(name, arrays)
    return splits_from_arrays(arrays, str(cache.cache_dir() / f"{name}.npz"))
