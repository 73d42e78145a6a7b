"""Attention options of the study: queries/keys from positional encodings, the zero-initialised gate,
attention in chosen layers only."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from kmipgt.nn import AttentionOptions, FourierFeatures, GPSLayer, GraphTransformer, KMIPAttention


def _graph(num_nodes=12, channels=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, 3 * num_nodes), generator=gen)
    return Data(
        x=torch.randn(num_nodes, channels, generator=gen),
        edge_index=edge_index,
        edge_attr=torch.randn(edge_index.size(1), 2, generator=gen),
    )


def test_kmip_queries_and_keys_from_a_separate_input_match_sdpa():
    torch.manual_seed(0)
    x, pos = torch.randn(10, 8), torch.randn(10, 3)
    attention = KMIPAttention(8, heads=2, k=10, qk_channels=3).eval()
    out = attention(x, qk_x=pos)
    shape = (10, 2, 4)
    q = attention.lin_query(pos).view(shape).transpose(0, 1)
    k = attention.lin_key(pos).view(shape).transpose(0, 1)
    v = attention.lin_value(x).view(shape).transpose(0, 1)
    expected = attention.lin_out(F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(10, 8))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-4)


def test_separate_query_key_input_must_match_its_size():
    attention = KMIPAttention(8, heads=2, k=4, qk_channels=3)
    with pytest.raises(ValueError, match="qk_x must have shape"):
        attention(torch.randn(10, 8))
    with pytest.raises(ValueError, match="qk_x must have shape"):
        attention(torch.randn(10, 8), qk_x=torch.randn(10, 4))


def test_gated_attention_layer_starts_as_the_mpnn_only_layer():
    torch.manual_seed(0)
    graph = _graph(channels=16)
    x = graph.x
    edge_attr = torch.randn(graph.edge_index.size(1), 16)
    mpnn_only = GPSLayer(16, attention="none", attn_kwargs={"heads": 4}).eval()
    gated = GPSLayer(16, attention="kmip", attn_kwargs={"heads": 4, "gate": True, "k": 3}).eval()
    missing, unexpected = gated.load_state_dict(mpnn_only.state_dict(), strict=False)
    assert not unexpected and all(m.startswith("attention") for m in missing)
    expected, _ = mpnn_only(x, graph.edge_index, edge_attr=edge_attr)
    out, _ = gated(x, graph.edge_index, edge_attr=edge_attr)
    torch.testing.assert_close(out, expected)
    with torch.no_grad():
        gated.attention_gate.fill_(1.0)
    out, _ = gated(x, graph.edge_index, edge_attr=edge_attr)
    assert not torch.allclose(out, expected)


def test_gate_needs_both_branches():
    with pytest.raises(ValueError, match="attention gate needs both"):
        GPSLayer(16, local="none", attention="kmip", attn_kwargs={"gate": True, "k": 3})


def test_attention_layers_and_encoding_queries_in_the_model():
    torch.manual_seed(0)
    graph = _graph()
    model = GraphTransformer(
        5, 16, 3, num_layers=3, edge_channels=2,
        encoder={"coord_columns": [0, 1], "num_frequencies": 2, "attention_qk": "encoding"},
        attn_kwargs={"layers": [-1], "k": 4},
    )
    assert [layer.attention is not None for layer in model.layers] == [False, False, True]
    assert model.layers[2].attention.qk_channels == 8
    out = model(graph.x, graph.edge_index, edge_attr=graph.edge_attr)
    out.sum().backward()
    assert out.shape == (12, 3)
    assert model.layers[2].attention.lin_query.weight.grad.abs().sum() > 0
    encodings = model.node_encoder.encodings(graph.x)
    torch.testing.assert_close(encodings, FourierFeatures(2)(graph.x[:, :2]))


def test_attention_option_errors():
    with pytest.raises(ValueError, match="needs coord_columns"):
        GraphTransformer(5, 16, 3, encoder={"attention_qk": "encoding"})
    with pytest.raises(ValueError, match="attention_qk must be one of"):
        GraphTransformer(5, 16, 3, encoder={"attention_qk": "values"})
    with pytest.raises(ValueError, match="layers must index the 2 layers"):
        GraphTransformer(5, 16, 3, num_layers=2, attn_kwargs={"layers": [2]})


def test_position_attention_starts_with_tied_query_key_projections():
    torch.manual_seed(0)
    model = GraphTransformer(
        5, 16, 3, num_layers=2,
        encoder={"coord_columns": [0, 1], "num_frequencies": 2, "attention_qk": "encoding"},
        attn_kwargs={"k": 4},
    )
    model.reset_parameters()
    for layer in model.layers:
        attention = layer.attention
        torch.testing.assert_close(attention.lin_key.weight, attention.lin_query.weight)
        assert attention.lin_query.bias.abs().sum() == 0 and attention.lin_key.bias.abs().sum() == 0
    # Tied projections make the score matrix a Gram matrix x^T W^T W y: symmetric, positive semi-definite.
    graph = _graph(30)
    query, key = model.layers[0].attention.query_key(model.node_encoder.encodings(graph.x))
    scores = torch.einsum("nhd,mhd->hnm", query, key).detach()
    torch.testing.assert_close(scores, scores.transpose(1, 2))
    assert (torch.linalg.eigvalsh(scores.double()) > -1e-5).all()


def test_position_queries_see_only_the_coordinate_features():
    torch.manual_seed(0)
    graph = _graph()
    rwse = torch.rand(12, 3)
    model = GraphTransformer(
        5, 16, 3, num_layers=1, edge_channels=2,
        encoder={"coord_columns": [0, 1], "num_frequencies": 2, "rwse_dim": 3, "attention_qk": "position"},
        attn_kwargs={"k": 4},
    )
    assert model.layers[0].attention.qk_channels == 8
    torch.testing.assert_close(
        model.node_encoder.encodings(graph.x, rwse=rwse, structural=False), FourierFeatures(2)(graph.x[:, :2])
    )
    assert model.node_encoder.encodings(graph.x, rwse=rwse).shape == (12, 11)
    assert model(graph.x, graph.edge_index, edge_attr=graph.edge_attr, rwse=rwse).shape == (12, 3)
    with pytest.raises(ValueError, match="attention_qk='position' needs coord_columns"):
        GraphTransformer(5, 16, 3, encoder={"rwse_dim": 3, "attention_qk": "position"})


def test_the_branch_takes_its_own_keys_and_hands_the_rest_to_the_core():
    options = AttentionOptions.from_kwargs({"heads": 2, "gate": True, "k": 4, "backend": "dense"})
    assert (options.heads, options.gate, options.order) == (2, True, "parallel")
    assert options.core == {"k": 4, "backend": "dense"}
    layer = GPSLayer(8, attn_kwargs={"heads": 2, "k": 4, "backend": "dense"})
    assert (layer.attention.heads, layer.attention.core.k, layer.attention.core.backend) == (2, 4, "dense")
    bad_options = (({"heads": 0}, "heads must be a positive int"), ({"dropout": 1.0}, "dropout must be"),
                   ({"head_dim": 0}, "head_dim must be positive"))
    for bad, message in bad_options:
        with pytest.raises(ValueError, match=message):
            AttentionOptions.from_kwargs(bad)
    with pytest.raises(TypeError, match="kk"):
        GPSLayer(8, attn_kwargs={"kk": 4})
