"""Tiny dataset copies in the raw formats PyG and OGB read, with random content, for tests: each writer lays
the files out under ``root`` where the class looks for them and returns what it wrote, as the reference a
test compares the loaded graphs with."""

from pathlib import Path

import numpy as np

from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS

WEBKB_SPLITS = 10  # WebKB's raw copy holds ten 60/20/20 splits


def _random_edges(rng: np.random.Generator, num_nodes: int, count: int) -> np.ndarray:
    """``[count, 2]`` distinct node pairs without self-loops."""
    pairs = [(i, j) for i in range(num_nodes) for j in range(num_nodes) if i != j]
    return np.array(pairs)[rng.choice(len(pairs), count, replace=False)]


def write_webkb(root: Path, name: str = "cornell", num_nodes: int = 9, num_features: int = 5,
                num_classes: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    """WebKB's raw copy of ``name`` in ``root/<name>/raw``: ``out1_node_feature_label.txt`` (a header, then
    ``id<TAB>f1,f2,...<TAB>label``), ``out1_graph_edges.txt`` (a header, then ``src<TAB>dst``) and
    ``<name>_split_0.6_0.2_<i>.npz`` (boolean ``train_mask``, ``val_mask``, ``test_mask``), as PyG's
    ``WebKB`` reads them. Returns ``x [N, F]`` (0/1), ``y [N]``, ``edges [E, 2]`` and the masks
    ``[N, 10]``."""
    rng = np.random.default_rng(seed)
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    x = rng.integers(0, 2, (num_nodes, num_features))
    y = rng.integers(0, num_classes, num_nodes)
    edges = _random_edges(rng, num_nodes, 2 * num_nodes)
    rows = [f"{i}\t{','.join(map(str, x[i]))}\t{y[i]}" for i in range(num_nodes)]
    (raw / "out1_node_feature_label.txt").write_text("\n".join(["node_id\tfeature\tlabel", *rows]) + "\n")
    rows = [f"{src}\t{dst}" for src, dst in edges]
    (raw / "out1_graph_edges.txt").write_text("\n".join(["node_id\tnode_id", *rows]) + "\n")
    masks = {key: np.zeros((num_nodes, WEBKB_SPLITS), dtype=bool) for key in ("train", "val", "test")}
    for split in range(WEBKB_SPLITS):
        part = rng.integers(0, 3, num_nodes)
        for index, key in enumerate(masks):
            masks[key][:, split] = part == index
        np.savez(raw / f"{name}_split_0.6_0.2_{split}.npz",
                 **{f"{key}_mask": masks[key][:, split] for key in masks})
    return {"x": x, "y": y, "edges": edges, **{f"{key}_mask": mask for key, mask in masks.items()}}


def write_tu(root: Path, name: str = "TOY", sizes: tuple[int, ...] = (3, 5, 4, 4), num_labels: int = 3,
             seed: int = 0) -> list[dict[str, np.ndarray]]:
    """A TU dataset in ``root/<name>/raw``: ``<name>_A.txt`` (1-based ``src, dst`` over all graphs' nodes),
    ``<name>_graph_indicator.txt`` (1-based graph of each node), ``<name>_graph_labels.txt`` and
    ``<name>_node_labels.txt``, as PyG's ``read_tu_data`` reads them. Returns each graph's ``edges [E, 2]``
    (its own node ids), ``node_labels [n]`` and ``label``."""
    rng = np.random.default_rng(seed)
    raw = root / name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    graphs, first = [], 0
    lines = {"A": [], "graph_indicator": [], "node_labels": [], "graph_labels": []}
    for index, size in enumerate(sizes):
        graph = {"edges": _random_edges(rng, size, size), "node_labels": rng.integers(0, num_labels, size),
                 "label": int(rng.integers(0, 2))}
        graphs.append(graph)
        lines["A"] += [f"{first + src + 1}, {first + dst + 1}" for src, dst in graph["edges"]]
        lines["graph_indicator"] += [str(index + 1)] * size
        lines["node_labels"] += [str(label) for label in graph["node_labels"]]
        lines["graph_labels"].append(str(graph["label"]))
        first += size
    for key, rows in lines.items():
        (raw / f"{name}_{key}.txt").write_text("\n".join(rows) + "\n")
    return graphs


def _save_csv(path: Path, array: np.ndarray, fmt: str = "%d") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savetxt(path, array.reshape(len(array), -1), fmt=fmt, delimiter=",")  # gzip by the .gz suffix


def _write_split(folder: Path, split: str, count: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``folder/split/<split>/{train,valid,test}.csv.gz``: a random partition of ``range(count)``, each part
    in increasing order (returned)."""
    parts = np.split(rng.permutation(count), [count // 2, 3 * count // 4])
    parts = {part: np.sort(index) for part, index in zip(("train", "valid", "test"), parts, strict=True)}
    for part, index in parts.items():
        _save_csv(folder / "split" / split / f"{part}.csv.gz", index)
    return parts


def write_ogbn_arxiv(root: Path, num_nodes: int = 12, num_features: int = 4, num_classes: int = 40,
                     seed: int = 0) -> dict[str, np.ndarray]:
    """A tiny release of ``ogbn-arxiv`` in ``root/ogbn_arxiv``, as OGB's download unpacks it:
    ``RELEASE_v1.txt``; ``raw/`` with ``edge``, ``node-feat``, ``node-label``, ``node_year``,
    ``num-node-list``, ``num-edge-list`` (``.csv.gz``); ``split/time/{train,valid,test}.csv.gz``. Returns
    ``x [N, F]`` (multiples of 1/4, exact in float32), ``y [N]``, ``edges [E, 2]`` and the split's index
    arrays."""
    rng = np.random.default_rng(seed)
    folder = root / "ogbn_arxiv"
    x, y = rng.integers(-8, 8, (num_nodes, num_features)) / 4, rng.integers(0, num_classes, num_nodes)
    edges = _random_edges(rng, num_nodes, 2 * num_nodes)
    for file, array, fmt in (("edge", edges, "%d"), ("node-feat", x, "%.2f"), ("node-label", y, "%d"),
                             ("node_year", rng.integers(2000, 2020, num_nodes), "%d"),
                             ("num-node-list", np.array([num_nodes]), "%d"),
                             ("num-edge-list", np.array([len(edges)]), "%d")):
        _save_csv(folder / "raw" / f"{file}.csv.gz", array, fmt)
    (folder / "RELEASE_v1.txt").write_text("ogbn-arxiv\n")
    return {"x": x, "y": y, "edges": edges, **_write_split(folder, "time", num_nodes, rng)}


def write_ogbg_molhiv(root: Path, sizes: tuple[int, ...] = (3, 5, 4, 6, 3, 4, 5, 2),
                      seed: int = 0) -> dict[str, object]:
    """A tiny release of ``ogbg-molhiv`` in ``root/ogbg_molhiv``: ``RELEASE_v1.txt``; ``raw/`` with
    ``edge`` (each graph's own node ids, one direction), ``edge-feat``, ``node-feat``, ``graph-label``,
    ``num-node-list``, ``num-edge-list`` (``.csv.gz``); ``split/scaffold/{train,valid,test}.csv.gz``.
    Returns per graph ``x [n, 9]`` (ids of OGB's atom features), ``edges [E, 2]``, ``edge_attr [E, 3]`` and
    ``label``, and the split's index arrays."""
    rng = np.random.default_rng(seed)
    folder = root / "ogbg_molhiv"
    graphs = []
    for size in sizes:
        edges = _random_edges(rng, size, size - 1)
        atoms = [rng.integers(0, dim, size) for dim in OGB_ATOM_DIMS]
        bonds = [rng.integers(0, dim, len(edges)) for dim in OGB_BOND_DIMS]
        graphs.append({"x": np.stack(atoms, 1), "edges": edges, "edge_attr": np.stack(bonds, 1),
                       "label": int(rng.integers(0, 2))})
    for file, key in (("edge", "edges"), ("edge-feat", "edge_attr"), ("node-feat", "x")):
        _save_csv(folder / "raw" / f"{file}.csv.gz", np.concatenate([graph[key] for graph in graphs]))
    _save_csv(folder / "raw" / "graph-label.csv.gz", np.array([graph["label"] for graph in graphs]))
    _save_csv(folder / "raw" / "num-node-list.csv.gz", np.array(sizes))
    _save_csv(folder / "raw" / "num-edge-list.csv.gz", np.array([len(graph["edges"]) for graph in graphs]))
    (folder / "RELEASE_v1.txt").write_text("ogbg-molhiv\n")
    return {"graphs": graphs, **_write_split(folder, "scaffold", len(sizes), rng)}
