"""The reference's k-MIP models on Peptides and GraphGPS's, as their configs build them on the datasets'
description (categorical atoms and bonds): sizes and the parts that make them the reference's."""

import pytest
from torch_geometric.nn.norm import LayerNorm as GraphLayerNorm

from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from kmipgt.sweep import cell_overrides, expand, load_sweep
from kmipgt.train import load_config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.models import build_model

# The reference's count for its Peptides-func model (its parameter budget fits width 80 under 500,000).
REFERENCE_PARAMETERS = 456_486


def _peptides(targets):
    return PreparedData("graph", None, None, 9, 3, targets, "lrgb", OGB_ATOM_DIMS, OGB_BOND_DIMS)


def _count(model):
    return sum(p.numel() for p in model.parameters())


def test_the_reference_peptides_func_model_has_its_size_and_parts():
    model = build_model(load_config("peptides_func_paper"), _peptides(10))
    assert abs(_count(model) - REFERENCE_PARAMETERS) <= 0.01 * REFERENCE_PARAMETERS
    encoder = model.node_encoder
    assert encoder.embed_x.sizes == OGB_ATOM_DIMS and encoder.embed_x.embeddings[0].embedding_dim == 52
    assert encoder.norm_rwse.num_features == 20 and encoder.lin_rwse.out_features == 28
    assert model.edge_encoder.embed.sizes == OGB_BOND_DIMS
    assert len(model.layers) == 6 and len(model.head.lins) == 2
    for layer in model.layers:
        attention = layer.attention
        assert (attention.heads, attention.qk_dim, attention.head_dim) == (4, 10, 20)
        assert not attention.output_projection and attention.k == 5
        assert layer.local.residual and not layer.local.node_residual
        assert all(isinstance(norm, GraphLayerNorm) for norm in (layer.norm_local, layer.norm_attn,
                                                                 layer.norm_ffn))


def test_graphgps_reference_model():
    model = build_model(load_config("peptides_func_gps"), _peptides(10))
    assert len(model.layers) == 4 and model.layers[0].channels == 96 and not model.head.lins
    attention = model.layers[0].attention
    assert attention.attn_type == "full" and attention.output_projection and attention.core.dropout == 0.5
    assert model.node_encoder.lin_lappe.out_features == 16 and model.layers[0].local.node_residual


@pytest.mark.parametrize(("sweep", "targets"), [("sweeps/lrgb_peptides_table", 10),
                                                ("sweeps/lrgb_peptides_struct_table", 11)])
def test_the_table_sweeps_build_every_cell(sweep, targets):
    sweep = load_sweep(sweep, out="unused")
    cells = expand(sweep)
    assert {cell.values["variant"] for cell in cells} == {
        "kmip_k5", "kmip_k10", "kmip_k20", "full", "none", "virtual_node"}
    assert {cell.values["seed"] for cell in cells} == {0, 1, 2}
    for cell in cells:
        config = load_config(sweep.base, cell_overrides(sweep, cell))
        model = build_model(config, _peptides(targets))
        attention = {layer.attention_kind for layer in model.layers}
        assert attention == {config.model.attention.kind}
        if config.model.attention.kind == "kmip":
            assert {layer.attention.k for layer in model.layers} == {config.model.attention.k}
