"""Stand-in data of ``kmipgt bench step`` (kmipgt.train.stand_in): shapes of the datasets it replaces."""

import networkx as nx
import pytest
import torch
from torch_geometric.utils import is_undirected, to_networkx

from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from kmipgt.train import load_config
from kmipgt.train.datasets import prepare_data
from kmipgt.train.stand_in import molecule_like_graphs, stand_in_data


@pytest.mark.parametrize(("name", "targets"), [("Peptides-func", 10), ("Peptides-struct", 11)])
def test_molecules_are_connected_sparse_graphs_with_ogb_features(name, targets):
    splits = molecule_like_graphs(name, {"train": 12, "val": 2}, seed=1)
    assert [len(splits[s]) for s in ("train", "val")] == [12, 2]
    for graph in splits["train"]:
        n = graph.num_nodes
        assert 100 <= n <= 199
        assert is_undirected(graph.edge_index) and not (graph.edge_index[0] == graph.edge_index[1]).any()
        assert nx.is_connected(to_networkx(graph, to_undirected=True))
        assert graph.edge_index.size(1) == 2 * (n - 1 + n // 40)  # a tree plus a ring per 40 atoms
        assert graph.x.shape == (n, 9) and graph.edge_attr.shape == (graph.edge_index.size(1), 3)
        assert (graph.x >= 0).all() and (graph.x < torch.tensor(OGB_ATOM_DIMS)).all()
        assert (graph.edge_attr < torch.tensor(OGB_BOND_DIMS)).all()
        assert graph.y.shape == (1, targets)
    labels = torch.cat([g.y for g in splits["train"]])
    assert labels.dtype == torch.float
    if name == "Peptides-func":  # binary labels; struct's targets are regression values
        assert set(labels.unique().tolist()) == {0.0, 1.0}
    again = molecule_like_graphs(name, {"train": 12, "val": 2}, seed=1)["train"][3]
    assert torch.equal(again.edge_index, splits["train"][3].edge_index)


def test_bad_molecule_options():
    with pytest.raises(ValueError, match="Peptides-func or Peptides-struct"):
        molecule_like_graphs("COCO-SP", {"train": 1})
    with pytest.raises(ValueError, match="atoms"):
        molecule_like_graphs("Peptides-func", {"train": 1}, atoms=(3, 2))


def test_stand_ins_prepare_like_the_datasets_they_replace():
    config = load_config("peptides_func", ["data.batch_size=3"])
    data = prepare_data(config, raw=stand_in_data(config, train_graphs=6))
    assert [len(data.splits[s]) for s in ("train", "val", "test")] == [6, 1, 1]
    assert (data.in_channels, data.edge_channels, data.out_channels) == (9, 3, 10)
    assert data.splits["train"][0].rwse.shape == (data.splits["train"][0].num_nodes, 16)
    city = load_config("synthetic_city", ["data.options={num_nodes: 300, seed: 2}"])
    graph = stand_in_data(city, train_graphs=0)
    assert graph.num_nodes == 300 and graph.x.shape == (300, 37) and int(graph.y.max()) < 10
    assert int(graph.train_mask.sum()) == 30 and not (graph.train_mask & graph.test_mask).any()
    assert stand_in_data(load_config("minnesota"), train_graphs=0) is None  # shipped: loaded as it is
    with pytest.raises(ValueError, match=r"data\.options\.name must be one of"):
        stand_in_data(load_config("city_networks", ["data.options={name: rome}"]), train_graphs=0)


@pytest.mark.parametrize(("name", "points", "columns", "k"),
                         [("s3dis", 4096, 9, 32), ("shapenet_part", 2048, 6, 8)])
def test_point_cloud_stand_ins_are_knn_graphs_of_the_datasets_columns_and_labels(name, points, columns, k):
    from kmipgt.data.shapenet_part import shapenet_part_category_parts

    config = load_config(name, ["data.options.root=/nowhere"])
    splits = stand_in_data(config, train_graphs=3)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [3, 1, 1]
    for graph in splits["train"]:
        xyz = graph.x[:, 3:] if name == "shapenet_part" else graph.x[:, :3]
        assert graph.x.shape == (points, columns) and torch.equal(graph.pos, xyz)
        targets = graph.edge_index[1].bincount(minlength=points)
        assert graph.edge_index.shape == (2, points * k) and bool((targets == k).all())
        distances = (graph.pos[graph.edge_index[0]] - graph.pos[graph.edge_index[1]]).norm(dim=1)
        assert float(distances.max()) < 0.5  # neighbours, not random pairs, of points in the unit cube
        if name == "s3dis":
            assert int(graph.y.min()) >= 0 and int(graph.y.max()) < 13
        else:
            allowed = shapenet_part_category_parts()[int(graph.category)]
            assert set(graph.y.unique().tolist()) <= set(allowed)
    data = prepare_data(config, raw=splits)
    assert data.in_channels == columns and len(data.splits["train"]) == 3
