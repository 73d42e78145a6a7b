"""A user-supplied copy of ShapeNet-Part (the "normal" release), read without network and writing nothing.

Layout under ``root`` (the release ``shapenetcore_partanno_segmentation_benchmark_v0_normal``, Yi et al.
2016, as distributed with PointNet++)::

    synsetoffset2category.txt                      # "<Category>\\t<synset id>" per line
    train_test_split/shuffled_{train,val,test}_file_list.json   # ["shape_data/<synset>/<shape>", ...]
    <synset>/<shape>.txt                           # one "x y z nx ny nz label" row per point

Labels are the release's 50 part ids, contiguous per category (PyG's ``ShapeNet.seg_classes``). PyG's own
``ShapeNet`` reads the same files but writes a processed copy under ``root`` and downloads on a missing
file, so the files are read here directly.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.datasets import ShapeNet

from kmipgt.data.point_cloud import knn_graph

__all__ = ["SHAPENET_PART_CATEGORIES", "shapenet_part", "shapenet_part_category_parts"]

SPLITS = ("train", "val", "test")
# category name -> synset id, in the order that numbers the categories (PyG's)
SHAPENET_PART_CATEGORIES: dict[str, str] = dict(ShapeNet.category_ids)
LAYOUT = (
    "expected the ShapeNet-Part 'normal' release (shapenetcore_partanno_segmentation_benchmark_v0_normal): "
    "synsetoffset2category.txt, train_test_split/shuffled_{train,val,test}_file_list.json and one "
    "'x y z nx ny nz label' text file per shape in <synset>/<shape>.txt"
)


def shapenet_part_category_parts() -> list[list[int]]:
    """The part ids of each category, in :data:`SHAPENET_PART_CATEGORIES` order."""
    return [list(ShapeNet.seg_classes[name]) for name in SHAPENET_PART_CATEGORIES]


def _require(path: Path, root: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"No ShapeNet-Part copy at {root}: missing {path}; {LAYOUT}")
    return path


def _synsets(root: Path) -> dict[str, int]:
    """synset id -> category index, for the categories the copy's ``synsetoffset2category.txt`` names."""
    index = {synset: i for i, synset in enumerate(SHAPENET_PART_CATEGORIES.values())}
    found = {}
    for line in _require(root / "synsetoffset2category.txt", root).read_text().splitlines():
        fields = line.split()
        if len(fields) != 2 or fields[1] not in index:
            raise ValueError(f"{root / 'synsetoffset2category.txt'}: unexpected line {line!r}; {LAYOUT}")
        found[fields[1]] = index[fields[1]]
    return found


def _read_shape(path: Path, root: Path, category: int, k: int, symmetric: bool) -> Data:
    rows = np.loadtxt(_require(path, root), dtype=np.float32, ndmin=2)
    if rows.shape[1] != 7:
        raise ValueError(f"{path}: expected 7 columns (x y z nx ny nz label), got {rows.shape[1]}")
    labels = rows[:, 6].astype(np.int64)
    allowed = shapenet_part_category_parts()[category]
    if not np.isin(labels, allowed).all():
        raise ValueError(f"{path}: part labels must be those of its category, {allowed}")
    pos, normals = torch.from_numpy(rows[:, :3].copy()), torch.from_numpy(rows[:, 3:6].copy())
    return Data(x=torch.cat([normals, pos], 1), pos=pos, y=torch.from_numpy(labels),
                category=torch.tensor([category]), edge_index=knn_graph(pos, k, symmetric=symmetric))


def shapenet_part(
    root: str | Path, k: int = 8, symmetric: bool = False, categories: list[str] | None = None
) -> dict[str, list[Data]]:
    """The official train / val / test shapes of a local ShapeNet-Part copy (module docstring's layout).

    Args:
        root: the release's top folder.
        k: neighbours of each shape's kNN graph (:func:`knn_graph`; 8 as in the paper).
        symmetric: symmetrise the kNN graphs (default directed, as the paper).
        categories: keep only these categories (names of :data:`SHAPENET_PART_CATEGORIES`); None: all.

    Returns:
        ``{"train", "val", "test"}`` lists of ``Data``: ``x [n, 6]`` (normals then position, the paper's
        features), ``pos [n, 3]``, ``y [n]`` part ids (0..49), ``category [1]`` and ``edge_index``.

    A missing root or file is a FileNotFoundError naming the file and the expected layout.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"No ShapeNet-Part copy at {root}: not a directory; {LAYOUT}")
    if categories is not None:
        unknown = sorted(set(categories) - set(SHAPENET_PART_CATEGORIES))
        if unknown:
            raise ValueError(f"categories must be among {list(SHAPENET_PART_CATEGORIES)}, got {unknown}")
    synsets = _synsets(root)
    keep = None if categories is None else {SHAPENET_PART_CATEGORIES[name] for name in categories}
    splits: dict[str, list[Data]] = {}
    for split in SPLITS:
        listing = _require(root / "train_test_split" / f"shuffled_{split}_file_list.json", root)
        graphs = []
        for entry in json.loads(listing.read_text()):
            _, synset, shape = entry.split("/")
            if synset not in synsets:
                raise ValueError(f"{listing}: synset {synset} is not in synsetoffset2category.txt")
            if keep is None or synset in keep:
                path = root / synset / f"{shape}.txt"
                graphs.append(_read_shape(path, root, synsets[synset], k, symmetric))
        splits[split] = graphs
    return splits
