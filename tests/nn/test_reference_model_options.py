"""The options that build the reference's k-MIP model: no output projection, per-graph LayerNorm, GatedGCN
without its node residual, concatenated and batch-normalised encodings; each against a computation by
hand."""

import pytest
import torch
import torch.nn.functional as F

from kmipgt.nn import FullAttention, GPSLayer, NodeEncoder
from kmipgt.nn.gated_gcn import GatedGCNLayer
from kmipgt.nn.gps_layer import build_norm, normalise
from kmipgt.ops.ragged import batch_layout


def test_without_output_projection_the_heads_are_concatenated():
    torch.manual_seed(0)
    x = torch.randn(9, 8)
    attention = FullAttention(8, heads=2, qk_dim=3, output_projection=False).eval()
    shape = (9, 2)
    q = attention.lin_query(x).view(*shape, 3).transpose(0, 1)
    k = attention.lin_key(x).view(*shape, 3).transpose(0, 1)
    v = attention.lin_value(x).view(*shape, 4).transpose(0, 1)
    expected = F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(9, 8)
    torch.testing.assert_close(attention(x), expected, atol=1e-6, rtol=1e-5)
    assert "output_projection=False" in repr(attention)
    assert not any("lin_out" in name for name, _ in attention.named_parameters())
    with pytest.raises(ValueError, match=r"output_projection=False needs heads \* head_dim == channels"):
        FullAttention(8, heads=2, head_dim=3, output_projection=False)


def test_the_graph_norm_normalises_each_graph_over_all_its_nodes_and_channels():
    torch.manual_seed(0)
    h, batch = torch.randn(7, 4), torch.tensor([0, 0, 0, 1, 1, 1, 1])
    norm = build_norm("graph", 4)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(4))
        norm.bias.copy_(torch.randn(4))
    out = normalise(norm, h, batch, batch_layout(7, h.device, batch=batch))
    for nodes in (slice(0, 3), slice(3, 7)):
        graph = h[nodes]
        mean, var = graph.mean(), graph.var(unbiased=False)
        expected = (graph - mean) / (var + norm.eps).sqrt() * norm.weight + norm.bias
        torch.testing.assert_close(out[nodes], expected)
    node_wise = build_norm("layer", 4)
    assert normalise(node_wise, h, batch, None).shape == h.shape


def test_a_layer_with_the_graph_norm_sees_each_graph_alone():
    torch.manual_seed(0)
    layer = GPSLayer(8, attention="full", norm="graph", attn_kwargs={"heads": 2}).eval()
    x = torch.randn(9, 8)
    edge_index = torch.tensor([[0, 1, 2, 4, 5, 7], [1, 2, 0, 5, 6, 8]])
    edge_attr = torch.randn(6, 8)
    batch = torch.tensor([0] * 4 + [1] * 5)
    out, _ = layer(x, edge_index, batch, edge_attr, layout=batch_layout(9, x.device, batch=batch))
    first, _ = layer(x[:4], edge_index[:, :3], None, edge_attr[:3])
    second, _ = layer(x[4:], edge_index[:, 3:] - 4, None, edge_attr[3:])
    torch.testing.assert_close(out, torch.cat([first, second]), atol=1e-5, rtol=1e-5)


def test_gatedgcn_without_node_residual_keeps_its_edge_residual():
    torch.manual_seed(0)
    with_residual = GatedGCNLayer(6).eval()
    without = GatedGCNLayer(6, node_residual=False).eval()
    without.load_state_dict(with_residual.state_dict())
    x, edge_attr = torch.randn(5, 6), torch.randn(4, 6)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    nodes, edges = with_residual(x, edge_index, edge_attr)
    nodes_only, edges_kept = without(x, edge_index, edge_attr)
    torch.testing.assert_close(nodes_only, nodes - x)
    torch.testing.assert_close(edges_kept, edges)


def test_local_residual_off_drops_the_local_branch_residual_alone():
    torch.manual_seed(0)
    layer = GPSLayer(6, attention="full", local_residual=False, ffn=False, attn_kwargs={"heads": 2}).eval()
    assert layer.local.node_residual is False and layer.local.residual is True
    with pytest.raises(ValueError, match="local_residual=True"):
        GPSLayer(6, local_residual=False, norm_position="pre")
    # A local kind without a residual of its own: the layer leaves out x + MPNN(x).
    gine = GPSLayer(6, local="gine", attention="none", local_residual=False, ffn=False).eval()
    x, edge_attr = torch.randn(5, 6), torch.randn(4, 6)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 4]])
    expected = F.gelu(gine.norm_local(gine.local(x, edge_index, edge_attr)))
    torch.testing.assert_close(gine(x, edge_index, edge_attr=edge_attr)[0], expected)


def test_encodings_concatenated_after_the_features_and_raw_walks_batch_normalised():
    torch.manual_seed(0)
    encoder = NodeEncoder(3, 10, rwse_dim=4, lappe_dim=2, pe_channels=4, rwse_norm=True).eval()
    with torch.no_grad():
        encoder.norm_rwse.running_mean.copy_(torch.rand(4))
        encoder.norm_rwse.running_var.copy_(torch.rand(4) + 0.5)
    x, lappe, rwse = torch.randn(6, 3), torch.randn(6, 2), torch.rand(6, 4)
    out = encoder(x, lappe=lappe, rwse=rwse)
    bn = encoder.norm_rwse
    normed = (rwse - bn.running_mean) / (bn.running_var + bn.eps).sqrt() * bn.weight + bn.bias
    torch.testing.assert_close(out[:, :6], encoder.lin_x(x))
    torch.testing.assert_close(out[:, 6:], encoder.lin_lappe(lappe) + encoder.lin_rwse(normed))
    assert encoder.lin_x.out_features == 6 and encoder.lin_rwse.out_features == 4
    with pytest.raises(ValueError, match="pe_channels"):
        NodeEncoder(3, 10, pe_channels=4)
    with pytest.raises(ValueError, match="rwse_norm needs rwse_dim"):
        NodeEncoder(3, 10, rwse_norm=True)
