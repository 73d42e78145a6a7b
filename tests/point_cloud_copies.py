"""Tiny local copies of ShapeNet-Part ("normal" layout) and S3DIS (PointNet hdf5 blocks) for tests."""

import json
from pathlib import Path

import numpy as np

# (split, synset, shape id, category index); Airplane = 02691156 (parts 0-3), Mug = 03797390 (parts 36, 37)
SHAPES = [
    ("train", "02691156", "a1", 0), ("train", "03797390", "m1", 11), ("train", "02691156", "a2", 0),
    ("val", "03797390", "m2", 11), ("test", "02691156", "a3", 0), ("test", "03797390", "m3", 11),
]
PARTS = {0: [0, 1, 2, 3], 11: [36, 37]}


def write_shapenet_part(root: Path, seed: int = 0, points: int = 30) -> dict[str, np.ndarray]:
    """Write the shapes of :data:`SHAPES`; returns each shape's ``[points, 7]`` rows by shape id."""
    rng = np.random.default_rng(seed)
    (root / "train_test_split").mkdir(parents=True)
    (root / "synsetoffset2category.txt").write_text("Airplane\t02691156\nMug\t03797390\n")
    rows = {}
    for split in ("train", "val", "test"):
        entries = [f"shape_data/{synset}/{shape}" for s, synset, shape, _ in SHAPES if s == split]
        (root / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(json.dumps(entries))
    for _, synset, shape, category in SHAPES:
        (root / synset).mkdir(exist_ok=True)
        normals = rng.normal(size=(points, 3))
        normals /= np.linalg.norm(normals, axis=1, keepdims=True)
        data = np.concatenate([rng.normal(size=(points, 3)), normals,
                               rng.choice(PARTS[category], size=(points, 1))], 1).astype(np.float32)
        np.savetxt(root / synset / f"{shape}.txt", data, fmt="%.6f")
        rows[shape] = np.loadtxt(root / synset / f"{shape}.txt", dtype=np.float32)
    return rows


def write_s3dis(root: Path, areas=(1, 1, 2, 5, 6, 6, 1), points: int = 40, seed: int = 0):
    """Blocks of ``areas`` over two .h5 files in ``root/indoor3d_sem_seg_hdf5_data``; returns
    ``(data, label)``."""
    import h5py

    rng = np.random.default_rng(seed)
    folder = root / "indoor3d_sem_seg_hdf5_data"
    folder.mkdir(parents=True)
    data = rng.uniform(0, 1, size=(len(areas), points, 9)).astype(np.float32)
    label = rng.integers(0, 13, size=(len(areas), points)).astype(np.uint8)
    cut = len(areas) // 2
    for index, part in enumerate((slice(0, cut), slice(cut, None))):
        with h5py.File(folder / f"ply_data_all_{index}.h5", "w") as file:
            file["data"], file["label"] = data[part], label[part]
    (folder / "room_filelist.txt").write_text("".join(f"Area_{a}_office_{i}\n" for i, a in enumerate(areas)))
    return data, label
