"""A dataset whose features are category ids (LRGB's molecules) is prepared as ids and embedded, because
the dataset says so: no config key asks for it."""

import pytest
import torch

from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from kmipgt.train import load_config
from kmipgt.train.datasets import prepare_data
from kmipgt.train.models import build_model


def _molecule(num_atoms, seed):
    generator = torch.Generator().manual_seed(seed)
    edge_index = torch.stack([torch.arange(num_atoms - 1), torch.arange(1, num_atoms)])
    edge_index = torch.cat([edge_index, edge_index.flip(0)], 1)
    atoms = torch.stack([torch.randint(0, size, (num_atoms,), generator=generator)
                         for size in OGB_ATOM_DIMS], 1)
    bonds = torch.stack([torch.randint(0, size, (edge_index.size(1),), generator=generator)
                         for size in OGB_BOND_DIMS], 1)
    return atoms, bonds, edge_index, torch.randint(0, 2, (1, 10), generator=generator).float()


def _copy(root, edit=None):
    raw = root / "peptides-func" / "raw"
    raw.mkdir(parents=True)
    for index, split in enumerate(("train", "val", "test")):
        graphs = [_molecule(5 + i, 10 * index + i) for i in range(3)]
        torch.save([edit(g) for g in graphs] if edit else graphs, raw / f"{split}.pt")
    return root


def _config(root, *overrides):
    return load_config("peptides_func", [f"data.options.root={root}", "data.rwse_dim=0", *overrides])


def test_molecule_features_stay_ids_and_are_embedded(tmp_path):
    data = prepare_data(_config(_copy(tmp_path)))
    assert data.node_categories == OGB_ATOM_DIMS and data.edge_categories == OGB_BOND_DIMS
    graph = data.splits["val"][1]
    atoms, bonds, _, _ = _molecule(6, 11)
    assert torch.equal(graph.x, atoms) and torch.equal(graph.edge_attr, bonds)  # neither scaled nor z-scored
    model = build_model(_config(tmp_path), data)
    assert model.node_encoder.embed_x.sizes == OGB_ATOM_DIMS and model.node_encoder.lin_x is None
    assert model.edge_encoder.embed.sizes == OGB_BOND_DIMS
    ablation = build_model(_config(tmp_path, "model.attention=none", "model.kind=gcn"), data)
    assert ablation.node_encoder.embed_x.sizes == OGB_ATOM_DIMS


def test_a_virtual_node_adds_its_marker_categories(tmp_path):
    data = prepare_data(_config(_copy(tmp_path), "data.virtual_node=true"))
    assert data.node_categories == (*OGB_ATOM_DIMS, 2) and data.edge_categories == (*OGB_BOND_DIMS, 2, 2)
    graph = data.splits["train"][0]
    assert graph.x[-1].tolist() == [0] * 9 + [1] and graph.x[:-1, -1].eq(0).all()


def test_ids_beyond_a_table_are_refused_before_a_model_sees_them(tmp_path):
    def too_many_chiralities(graph):
        atoms = graph[0].clone()
        atoms[0, 1] = OGB_ATOM_DIMS[1]
        return (atoms, *graph[1:])

    with pytest.raises(ValueError, match=r"^dataset 'lrgb', train: x: column 1 must hold category ids in "
                                         r"\[0, 5\), got ids in \[0, 5\]$"):
        prepare_data(_config(_copy(tmp_path, too_many_chiralities)))
