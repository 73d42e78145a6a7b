"""``kmipgt data info`` on every registered set of graphs: the numbers it prints against the loader's own
graphs, counted here."""

import statistics
from collections import Counter

import pytest
import torch
import yaml
from torch_geometric.data import Data

from kmipgt.cli import main
from kmipgt.data import DATASETS, get_dataset
from kmipgt.data.registry import ONE_GRAPH
from lrgb_copies import write_raw_peptides
from point_cloud_copies import write_s3dis, write_shapenet_part
from pyg_copies import write_ogbg_molhiv


def _lrgb(root):
    write_raw_peptides(root, {"train": [5, 9, 4, 7], "val": [6, 8], "test": [3]})
    return {"root": str(root), "name": "Peptides-func"}


def _pyg(root):
    return {"class": "LRGBDataset", **_lrgb(root)}  # PyG's class reading the same copy


def _ogb(root):
    write_ogbg_molhiv(root)
    return {"root": str(root), "name": "ogbg-molhiv"}


def _shapenet_part(root):
    write_shapenet_part(root)
    return {"root": str(root), "k": 4}


def _s3dis(root):
    write_s3dis(root)
    return {"root": str(root), "k": 4, "val_blocks": 1}


def _file(root):
    """A split dict of three graphs saved with torch.save, as a user's own set of graphs."""
    root.mkdir(parents=True)
    graphs = [Data(x=torch.rand(n, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.arange(n) % 3)
              for n in (3, 5, 4)]
    torch.save({"train": graphs[:2], "val": graphs[2:], "test": graphs[2:]}, root / "graphs.pt")
    return {"path": str(root / "graphs.pt")}


# Every registered set of graphs -> its loader options here (a tiny generated set or a planted local copy).
SETS = {
    "lrgb": _lrgb,
    "synthetic_parts": lambda root: {"num_shapes": 6, "num_points": 64},
    "synthetic_rooms": lambda root: {"rooms_per_area": 1, "num_points": 64, "k": 4, "val_blocks": 2},
    "shapenet_part": _shapenet_part,
    "s3dis": _s3dis,
    "file": _file,
    "pyg": _pyg,
    "ogb": _ogb,
}
NEEDS = {"s3dis": "h5py", "ogb": "ogb"}


def test_every_registered_set_of_graphs_is_covered():
    assert set(SETS) == {name for name, dataset in DATASETS.items() if dataset.levels != ONE_GRAPH}


def _printed(text: str) -> dict:
    """The ``key: value`` lines, numbers and lists read as YAML, shapes (``[nodes, 9] int64``) as text."""
    pairs = (line.partition(": ") for line in text.splitlines())
    return {key: value if key.endswith("_shape") else yaml.safe_load(value) for key, _, value in pairs}


def _min_median_max(values):
    return [min(values), statistics.median(values), max(values)]


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.requires(NEEDS[name])) if name in NEEDS else name for name in SETS
])
def test_data_info_summarises_a_set_of_graphs(name, tmp_path, capsys):
    options = SETS[name](tmp_path / "copy")
    arguments = [part for key, value in options.items() for part in ("--set", f"{key}={value}")]
    assert main(["data", "info", name, *arguments]) == 0
    printed = _printed(capsys.readouterr().out)
    splits = get_dataset(name).load(**options)
    graphs = [graph for split in splits.values() for graph in split]
    assert printed["graphs"] == len(graphs)
    assert all(printed[f"{split}_graphs"] == len(members) for split, members in splits.items())
    assert printed["nodes_per_graph_min_median_max"] == _min_median_max([g.num_nodes for g in graphs])
    edges = [graph.edge_index.size(1) for graph in graphs]
    assert printed["edges_per_graph_min_median_max"] == _min_median_max(edges)
    first = graphs[0]
    assert printed["x_shape"] == f"[nodes, {first.x.size(1)}] {str(first.x.dtype)[6:]}"
    labels = torch.cat([graph.y.view(-1) for graph in graphs])
    if name in ("lrgb", "pyg"):  # ten binary targets per molecule
        assert printed["y_shape"] == "[1, 10] float32"
        assert printed["edge_attr_shape"] == "[edges, 3] int64"
        shares = torch.stack([graph.y.view(-1) for graph in graphs]).mean(0)
        assert printed["label_positive_shares"] == pytest.approx(shares.tolist(), abs=1e-4)
    else:  # a class per point, or per molecule (ogbg-molhiv)
        expected = "[1, 1] int64" if name == "ogb" else "[nodes]"
        assert printed["y_shape"].startswith(expected)
        counts = Counter(labels.tolist())
        assert printed["class_sizes"] == [counts.get(c, 0) for c in range(max(counts) + 1)]
    assert printed["read_seconds"] >= 0


def test_data_info_of_a_missing_copy_is_the_loaders_error(tmp_path, capsys):
    assert main(["data", "info", "lrgb", "--root", str(tmp_path), "--set", "name=Peptides-func"]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"kmipgt: error: No local copy of Peptides-func under {tmp_path}")


def test_continuous_targets_are_summarised_per_column(capsys):
    from kmipgt.data.report import graph_set_summary
    from kmipgt.train.stand_in import molecule_like_graphs

    splits = molecule_like_graphs("Peptides-struct", {"train": 3, "val": 1, "test": 1}, atoms=(6, 9))
    summary = graph_set_summary(splits)
    targets = torch.cat([graph.y for split in splits.values() for graph in split])
    assert summary["y_shape"] == "[1, 11] float32"
    expected = [[round(float(v), 4) for v in (column.min(), column.median(), column.max())]
                for column in targets.T]
    assert summary["label_min_median_max"] == expected
