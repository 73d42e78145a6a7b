"""The registries of attention and local MPNN kinds: what the layers, the model and the strategies read
from each kind's flags."""

import pytest
import torch

from kmipgt.analysis import explainable_kinds
from kmipgt.distributed.choices import partitioned_attention_kinds, partitioned_local_kinds
from kmipgt.nn import (
    ATTENTION_KINDS,
    LOCAL_KINDS,
    AttentionKind,
    GPSLayer,
    GraphTransformer,
    KMIPAttention,
    KMIPCore,
    ProjectedAttention,
)


def test_the_shipped_kinds_and_what_reads_their_flags():
    assert ATTENTION_KINDS.names() == ("kmip", "full", "performer", "grf", "none")
    assert LOCAL_KINDS.names() == ("gatedgcn", "gine", "sage", "gcn", "gat", "none")
    assert explainable_kinds() == ("kmip", "full")
    assert partitioned_attention_kinds() == ("kmip", "none")
    assert partitioned_local_kinds() == ("gatedgcn", "gine", "sage", "gat", "none")
    assert [name for name, kind in LOCAL_KINDS.items() if kind.own_residual] == ["gatedgcn"]


def test_a_name_is_registered_once_and_none_names_no_kind():
    with pytest.raises(ValueError, match="already registered"):
        ATTENTION_KINDS.register(AttentionKind("kmip", KMIPCore))
    with pytest.raises(ValueError, match="no attention"):
        ATTENTION_KINDS.register(AttentionKind("none", KMIPCore))
    with pytest.raises(ValueError, match="already registered"):
        LOCAL_KINDS.register(LOCAL_KINDS.lookup("gcn"))
    with pytest.raises(ValueError, match="attention kind"):
        ATTENTION_KINDS.lookup("flash")
    with pytest.raises(ValueError, match="local MPNN"):
        LOCAL_KINDS.lookup("gin")
    with pytest.raises(ValueError, match="explain"):
        AttentionKind("toy", KMIPCore, explain="weights")


@pytest.mark.parametrize("local", LOCAL_KINDS.names())
def test_edge_features_reach_the_model_exactly_where_the_kind_supports_them(local):
    torch.manual_seed(0)
    model = GraphTransformer(
        5, 8, 2, num_layers=1, edge_channels=3, local=local, attn_kwargs={"heads": 2, "k": 2},
    )
    x, edge_index = torch.randn(6, 5), torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    first, second = (model.eval()(x, edge_index, edge_attr=torch.randn(5, 3)) for _ in range(2))
    reads_edges = local != "none" and LOCAL_KINDS.lookup(local).supports_edge_attr
    assert (model.edge_encoder is not None) == reads_edges
    assert (not torch.equal(first, second)) == reads_edges


def test_module_and_kind_must_agree():
    with pytest.raises(TypeError, match="attn_type"):
        ProjectedAttention(8, 2)
    with pytest.raises(ValueError, match="'kmip'"):
        KMIPAttention(8, 2, attn_type="full")
    assert ProjectedAttention(8, 2, attn_type="full").kind is ATTENTION_KINDS.lookup("full")


def test_a_kind_that_reads_edges_requires_them():
    module = ATTENTION_KINDS.lookup("grf").module_class(8, 2, attn_type="grf")
    with pytest.raises(ValueError, match="edge_index"):
        module(torch.randn(4, 8))


def test_a_kind_without_qk_x_refuses_queries_from_the_encodings():
    ATTENTION_KINDS.register(AttentionKind("no_qk", KMIPCore, qk_x=False))
    try:
        with pytest.raises(ValueError, match="qk_x"):
            GraphTransformer(
                5, 8, 2, attention="no_qk",
                encoder={"attention_qk": "position", "coord_columns": [0, 1], "num_frequencies": 2},
                attn_kwargs={"k": 2},
            )
    finally:
        ATTENTION_KINDS.remove("no_qk")


def test_the_model_hands_its_layer_arguments_to_every_layer_and_refuses_unknown_ones():
    model = GraphTransformer(
        5, 8, 2, num_layers=2, local="sage", norm="batch", attn_kwargs={"heads": 2, "k": 2},
    )
    assert all(isinstance(layer, GPSLayer) and layer.local_kind == "sage" for layer in model.layers)
    assert all(isinstance(layer.norm_local, torch.nn.BatchNorm1d) for layer in model.layers)
    with pytest.raises(TypeError, match="nrom"):
        GraphTransformer(5, 8, 2, nrom="batch")
    with pytest.raises(ValueError, match="qk_channels"):
        GraphTransformer(5, 8, 2, attn_kwargs={"qk_channels": 4})
