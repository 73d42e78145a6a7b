"""A user-supplied copy of S3DIS in PointNet's block layout, read without network and writing nothing.

Layout under ``root`` (PointNet's ``indoor3d_sem_seg_hdf5_data``, Qi et al. 2017; ``root`` may be that
folder or its parent)::

    ply_data_all_0.h5, ply_data_all_1.h5, ...      # data [B, 4096, 9] float, label [B, 4096] int
    room_filelist.txt                              # "Area_<a>_<room>" per block, in file order

The 9 columns of ``data`` are block-centred xyz, rgb in [0, 1] and room-normalised xyz, the paper's
features. Reading HDF5 needs ``h5py`` (``pip install 'kmipgt[s3dis]'``). PyG's ``S3DIS`` reads the same
files but writes a processed copy under ``root`` and downloads on a missing file.

The whole set (about 23,600 blocks, 3.5 GB of features and more than 40 GB of kNN graphs at k = 32) does not
fit in memory: ``stream=True`` reads each mini-batch's blocks from the files and builds their graphs when
the batch is drawn.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch
from torch_geometric.data import Data

from kmipgt.data.point_cloud import knn_graph
from kmipgt.data.streamed import StreamedGraphs

__all__ = ["S3DIS_CLASSES", "S3DISBlocks", "area_split", "s3dis", "split_by_area"]

S3DIS_CLASSES = (
    "ceiling", "floor", "wall", "beam", "column", "window", "door", "table", "chair", "sofa", "bookcase",
    "board", "clutter",
)
FOLDER = "indoor3d_sem_seg_hdf5_data"
LAYOUT = (
    f"expected PointNet's {FOLDER} release: ply_data_all_<i>.h5 files (data [B, 4096, 9], label [B, 4096]) "
    "and room_filelist.txt naming each block's Area_<a>_<room>"
)


def _h5py():
    try:
        import h5py
    except ImportError:
        raise ImportError("reading S3DIS needs h5py: pip install 'kmipgt[s3dis]'") from None
    return h5py


def _files(root: Path) -> tuple[list[Path], Path]:
    folder = root / FOLDER if (root / FOLDER).is_dir() else root
    if not folder.is_dir():
        raise FileNotFoundError(f"No S3DIS copy at {root}: not a directory; {LAYOUT}")
    h5 = sorted(folder.glob("ply_data_all_*.h5"), key=lambda p: int(re.findall(r"\d+", p.stem)[-1]))
    if not h5:
        raise FileNotFoundError(f"No S3DIS copy at {root}: no ply_data_all_*.h5 in {folder}; {LAYOUT}")
    rooms = folder / "room_filelist.txt"
    if not rooms.is_file():
        raise FileNotFoundError(f"No S3DIS copy at {root}: missing {rooms}; {LAYOUT}")
    return h5, rooms


def _block(data: np.ndarray, label: np.ndarray, k: int, symmetric: bool, area: int) -> Data:
    x = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
    pos = x[:, :3].clone()
    return Data(x=x, pos=pos, y=torch.from_numpy(label.astype(np.int64)), area=torch.tensor([area]),
                edge_index=knn_graph(pos, k, symmetric=symmetric))


def _areas(rooms: Path) -> list[int]:
    """The area of each block, from ``room_filelist.txt``'s ``Area_<a>_<room>`` lines."""
    areas = []
    for name in rooms.read_text().split():
        match = re.match(r"Area_(\d)_", name)
        if match is None:
            raise ValueError(f"{rooms}: expected Area_<a>_<room> names, got {name!r}")
        areas.append(int(match.group(1)))
    return areas


class S3DISBlocks:
    """Reads blocks of a local S3DIS copy (module docstring's layout) by index, each as one kNN graph.

    Block ``i`` is the ``i``-th row over the ``.h5`` files in order, of area ``areas[i]``. Calling the
    reader with block indices reads just those rows (one HDF5 selection per file) and builds their graphs,
    so it can feed a :class:`~kmipgt.data.streamed.StreamedGraphs`. The files' shapes are checked when it is
    made, from their headers; no data is read then.
    """

    def __init__(self, files: list[Path], areas: list[int], k: int, symmetric: bool, rooms: Path):
        h5py = _h5py()
        self.files, self.areas, self.k, self.symmetric = files, areas, k, symmetric
        sizes = []
        for path in files:
            with h5py.File(path, "r") as file:
                data, label = file["data"].shape, file["label"].shape
            if len(data) != 3 or data[2] != 9 or label != data[:2]:
                raise ValueError(f"{path}: expected data [B, P, 9] and label [B, P], got {data} and {label}")
            sizes.append(data[0])
        if sum(sizes) != len(areas):
            raise ValueError(f"{rooms} names {len(areas)} blocks, the .h5 files hold {sum(sizes)}")
        self._starts = np.cumsum([0, *sizes])

    def __len__(self) -> int:
        return len(self.areas)

    def __call__(self, blocks: list[int]) -> list[Data]:
        """The graphs of ``blocks`` (indices in ``[0, len)``, any order, repeats allowed), in that order."""
        h5py = _h5py()
        wanted = np.asarray(blocks, dtype=np.int64)
        if wanted.size and (wanted.min() < 0 or wanted.max() >= len(self)):
            raise IndexError(f"block indices must be in [0, {len(self)}), got {blocks}")
        graphs: list[Data | None] = [None] * len(wanted)
        file_of = np.searchsorted(self._starts, wanted, side="right") - 1
        for index in np.unique(file_of):
            # HDF5 selections take increasing, distinct rows: read those, then hand them out.
            mine = np.flatnonzero(file_of == index)
            rows, where = np.unique(wanted[mine] - self._starts[index], return_inverse=True)
            with h5py.File(self.files[index], "r") as file:
                data, label = file["data"][rows], file["label"][rows]
            for slot, row in zip(mine, where.reshape(-1), strict=True):
                graphs[slot] = _block(data[row], label[row], self.k, self.symmetric,
                                      self.areas[int(wanted[slot])])
        return graphs  # type: ignore[return-value]


def s3dis(
    root: str | Path, test_area: int = 6, k: int = 32, symmetric: bool = False, val_blocks: int | None = None,
    seed: int = 0, stream: bool = False,
) -> dict[str, list[Data] | StreamedGraphs]:
    """The blocks of a local S3DIS copy (module docstring's layout), one graph each, split by area.

    Args:
        root: the ``indoor3d_sem_seg_hdf5_data`` folder or its parent.
        test_area: the held-out area, 1..6 (6 as in the paper; 5 as most of the literature reports).
        k: neighbours of each block's kNN graph (:func:`knn_graph`; 32 as in the paper).
        symmetric: symmetrise the kNN graphs (default directed, as the paper).
        val_blocks: blocks of the other areas drawn (with ``seed``) for validation and left out of training;
            None: as many as the test area has, as the paper's validation set.
        stream: each split a :class:`~kmipgt.data.streamed.StreamedGraphs` that reads its blocks from the
            files when asked for and builds their kNN graphs then, so memory holds a mini-batch of blocks
            rather than the whole set (the same graphs, in the same order, as the lists of the default).

    Returns:
        ``{"train", "val", "test"}`` lists (or streams) of ``Data``: ``x [4096, 9]`` (xyz, rgb,
        room-normalised xyz), ``pos [4096, 3]``, ``y [4096]`` classes of :data:`S3DIS_CLASSES`, ``area [1]``
        and ``edge_index``.

    A missing root or file is a FileNotFoundError naming the expected layout; missing h5py an ImportError.
    """
    if not isinstance(test_area, int) or not 1 <= test_area <= 6:
        raise ValueError(f"test_area must be an int in 1..6, got {test_area!r}")
    _h5py()
    files, rooms = _files(Path(root))
    areas = _areas(rooms)
    blocks = StreamedGraphs(S3DISBlocks(files, areas, k, symmetric, rooms), range(len(areas)))
    splits = area_split(areas, test_area, val_blocks, seed)
    if stream:
        return {split: blocks.subset(indices) for split, indices in splits.items()}
    graphs = list(blocks)
    return {split: [graphs[i] for i in indices] for split, indices in splits.items()}


def area_split(areas: list[int], test_area: int, val_blocks: int | None, seed: int) -> dict[str, list[int]]:
    """The block indices of each split of blocks in ``areas``: test, those of ``test_area``; validation,
    ``val_blocks`` of the others drawn with ``seed`` (None: as many as the test area has); training, the
    rest, each in block order."""
    test = [i for i, area in enumerate(areas) if area == test_area]
    rest = [i for i, area in enumerate(areas) if area != test_area]
    if not test or not rest:
        raise ValueError(f"test_area {test_area}: there are blocks of areas {sorted(set(areas))} only")
    count = len(test) if val_blocks is None else val_blocks
    if not isinstance(count, int) or not 1 <= count < len(rest):
        raise ValueError(f"val_blocks must be an int in [1, {len(rest) - 1}], got {val_blocks!r}")
    chosen = set(np.random.default_rng(seed).choice(len(rest), size=count, replace=False).tolist())
    return {
        "train": [block for i, block in enumerate(rest) if i not in chosen],
        "val": [block for i, block in enumerate(rest) if i in chosen],
        "test": test,
    }


def split_by_area(
    blocks: list[Data], areas: list[int], test_area: int, val_blocks: int | None, seed: int
) -> dict[str, list[Data]]:
    """``blocks`` split as :func:`area_split` splits their ``areas``."""
    splits = area_split(areas, test_area, val_blocks, seed)
    return {split: [blocks[i] for i in indices] for split, indices in splits.items()}
