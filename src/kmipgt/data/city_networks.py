"""User-supplied copies of the City-Networks benchmark (Paris, Shanghai, LA, London), read without network.

PyG's ``CityNetwork`` tries to download whenever ``raw/<name>.json`` is missing, a file the released tarballs
never contain, and crashes on raw files alone; so the released files are read here directly. Accepted
layouts, searched in this order under ``root``:

- an extracted tarball: ``<root>/<name>/``, ``<root>/<name>/raw/`` or ``<root>/`` holding the files below;
- the tarball itself: ``<root>/<name>.tar.gz`` (or ``root`` is that file), members matched by file name;
- a PyG-processed copy: ``<root>/<name>/processed/data.pt``.

Every file is read weights-only (tensors and plain values; a file that refers to anything else is refused
with :class:`~kmipgt.safe_load.RefusedFileError`), so a copy from elsewhere cannot run code.

Released files: ``node_features_augmented.pt`` ``[n, 37]`` (or ``node_features.pt`` ``[n, 12]``),
``edge_indices.pt`` ``[2, E]``, ``10-chunk_16-hop_node_labels.pt`` ``[n]`` and ``train_mask.pt``,
``valid_mask.pt``, ``test_mask.pt`` (boolean, or index tensors as the authors' generator writes them).
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch_geometric.data import Data, InMemoryDataset

from kmipgt.data.graph_checks import check_class_labels, check_edge_index, check_node_rows
from kmipgt.data.road_graph import haversine_metres, road_network_data, symmetric_edges
from kmipgt.data.splits import index_to_mask, random_split_masks
from kmipgt.safe_load import load_processed_dataset, torch_load_safely

# The released cities' sizes: nodes, and undirected roads (City-Networks, arXiv 2503.09008).
CITY_NUM_NODES = {"paris": 114_127, "shanghai": 183_917, "la": 240_587, "london": 568_795}
CITY_NUM_EDGES = {"paris": 182_511, "shanghai": 262_092, "la": 341_523, "london": 756_502}
FEATURE_FILES = {True: "node_features_augmented.pt", False: "node_features.pt"}
EDGE_FILE = "edge_indices.pt"
LABEL_FILE = "10-chunk_16-hop_node_labels.pt"
MASK_FILES = {"train_mask": "train_mask.pt", "val_mask": "valid_mask.pt", "test_mask": "test_mask.pt"}


class _Files:
    """Reads named tensors from a directory or from a tar archive (any member path with that file name)."""

    def __init__(self, directory: Path | None = None, archive: Path | None = None) -> None:
        self.directory, self.archive = directory, archive
        self.members: dict[str, tarfile.TarInfo] = {}
        if archive is not None:
            with tarfile.open(archive) as tar:
                self.members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}

    def has(self, name: str) -> bool:
        if self.archive is not None:
            return name in self.members
        return (self.directory / name).is_file()

    def source(self, name: str) -> str:
        """The file ``name`` as errors name it: its path, or ``archive:member``."""
        if self.archive is None:
            return str(self.directory / name)
        return f"{self.archive}:{self.members[name].name}"

    def load(self, name: str) -> torch.Tensor:
        if self.archive is None:
            return torch_load_safely(self.directory / name, self.source(name))
        with tarfile.open(self.archive) as tar:
            buffer = io.BytesIO(tar.extractfile(self.members[name]).read())
        return torch_load_safely(buffer, self.source(name))


def _find_files(root: Path, name: str, augmented: bool) -> tuple[_Files | None, Path | None, list[Path]]:
    """First layout under ``root`` with features and edges, else None; a processed file; the paths tried."""
    required = (FEATURE_FILES[augmented], EDGE_FILE)
    tried: list[Path] = []
    for directory in (root / name, root / name / "raw", root):
        tried.extend(directory / file for file in required)
        if all((directory / file).is_file() for file in required):
            return _Files(directory=directory), None, tried
    for archive in ((root,) if root.is_file() else ()) + (root / f"{name}.tar.gz",):
        tried.append(archive)
        if archive.is_file():
            files = _Files(archive=archive)
            if all(files.has(file) for file in required):
                return files, None, tried
    processed = root / name / "processed" / "data.pt"
    tried.append(processed)
    return None, (processed if processed.is_file() else None), tried


def load_city_network(
    root: str | Path,
    name: str,
    *,
    augmented: bool = True,
    labels: str = "auto",
    num_workers: int | None = None,
    progress: bool = True,
) -> Data:
    """One City-Networks graph from a local copy, as a road-network ``Data``.

    Args:
        root: directory (or ``.tar.gz``) holding the copy; layouts in the module docstring.
        name: city, one of ``paris``, ``shanghai``, ``la``, ``london`` (other names are read without the
            size check).
        augmented: read the 37 augmented features (True) or the 12 node features.
        labels: ``"file"`` uses the released labels (error when absent; no ``eccentricity`` then, since the
            release holds none); ``"compute"`` recomputes ``eccentricity`` and ``y`` with
            :func:`eccentricity_labels` on haversine lengths between node coordinates (features 0-1 are
            lon/lat; OSM road lengths follow the road's curve, so recomputed classes can differ from the
            released ones); ``"auto"`` is "file" when the labels file exists, else "compute".

    Returns:
        ``Data`` with ``x`` float32, ``edge_index`` (symmetrised, deduplicated, no self-loops),
        ``edge_length`` (float64 metres, haversine between the ends), ``y``, boolean ``train_mask``,
        ``val_mask``, ``test_mask`` (seed-0 10/10/80 when the copy has no masks) and ``eccentricity`` when
        computed.
    """
    if labels not in ("auto", "file", "compute"):
        raise ValueError(f"labels must be 'auto', 'file' or 'compute', got {labels!r}")
    root, name = Path(root), name.lower()
    files, processed, tried = _find_files(root, name, augmented)
    if files is None and processed is None:
        listing = "\n  ".join(str(path) for path in tried)
        raise FileNotFoundError(
            f"No City-Networks copy of {name!r} under {root}. Looked for:\n  {listing}\n"
            "Download <name>.tar.gz from the City-Networks release and pass its directory (or the archive)."
        )
    if files is None:
        stored, _ = load_processed_dataset(processed)  # one graph: its slices say nothing more
        x, edge_index = stored.x, stored.edge_index
        stored_y = getattr(stored, "y", None)
        stored_masks = {key: getattr(stored, key, None) for key in MASK_FILES}
        sources = {key: f"{processed}: {key}" for key in ("x", "edge_index", "y", *MASK_FILES)}
    else:
        x, edge_index = files.load(FEATURE_FILES[augmented]), files.load(EDGE_FILE)
        stored_y = files.load(LABEL_FILE) if files.has(LABEL_FILE) else None
        stored_masks = {key: files.load(file) if files.has(file) else None
                        for key, file in MASK_FILES.items()}
        named = {"x": FEATURE_FILES[augmented], "edge_index": EDGE_FILE, "y": LABEL_FILE, **MASK_FILES}
        sources = {key: files.source(file) for key, file in named.items() if files.has(file)}
    # Checked before anything is indexed by them: a copy from elsewhere may hold any tensor.
    x = check_node_rows(x, sources["x"])
    if x.size(1) < 2:
        raise ValueError(f"{sources['x']} must have 2 columns or more (longitude, latitude), got {x.size(1)}")
    num_nodes = x.size(0)
    edge_index = check_edge_index(edge_index, num_nodes, sources["edge_index"])
    if name in CITY_NUM_NODES and num_nodes != CITY_NUM_NODES[name]:
        raise ValueError(f"{name} has {CITY_NUM_NODES[name]} nodes in the released data, but the copy under "
                         f"{root} has {num_nodes}: wrong or truncated files")
    if labels == "file" and stored_y is None:
        raise FileNotFoundError(f"labels='file' but the copy under {root} has no {LABEL_FILE}")
    compute = labels == "compute" or stored_y is None
    if not compute:
        stored_y = check_class_labels(stored_y, sources["y"], count=num_nodes).view(-1)
    edge_index, _ = symmetric_edges(edge_index, num_nodes)
    lonlat = x[:, :2].double().numpy()
    src, dst = edge_index.numpy()
    edge_length = torch.from_numpy(haversine_metres(lonlat[src], lonlat[dst]))
    data = road_network_data(x.float(), edge_index, edge_length, labels=compute, num_workers=num_workers,
                             progress=progress, name=name)
    if not compute:
        data.y = stored_y
    default_masks = dict(zip(MASK_FILES, random_split_masks(num_nodes), strict=True))
    for key, mask in stored_masks.items():
        data[key] = default_masks[key] if mask is None else index_to_mask(mask.view(-1), num_nodes,
                                                                           name=sources[key])
    return data


class CityNetworks(InMemoryDataset):
    """A local City-Networks copy as a one-graph PyG dataset (``dataset[0]``); see :func:`load_city_network`.

    Nothing is downloaded or written: the files are read at construction, and ``transform`` (e.g. a
    positional encoding) is applied on access like any PyG dataset.
    """

    def __init__(
        self,
        root: str | Path,
        name: str,
        *,
        augmented: bool = True,
        labels: str = "auto",
        transform: Callable[[Data], Data] | None = None,
        num_workers: int | None = None,
        progress: bool = True,
    ) -> None:
        super().__init__(None, transform)
        self.name = name.lower()
        data = load_city_network(root, name, augmented=augmented, labels=labels, num_workers=num_workers,
                                 progress=progress)
        self._data, self.slices = self.collate([data])

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.name})"
