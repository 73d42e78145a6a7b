"""Pre-norm GPS layers: norms on the branch inputs, an unnormalised residual stream, one norm at the end."""

import pytest
import torch
import torch.nn.functional as F

from kmipgt.nn import GatedGCNLayer, GPSLayer, GraphTransformer
from kmipgt.train import build_model, load_config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.validation import validate_config


def _inputs(num_nodes=40, channels=16, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_nodes, channels, generator=gen)
    edge_index = torch.randint(0, num_nodes, (2, 4 * num_nodes), generator=gen)
    return x, edge_index, torch.randn(edge_index.size(1), channels, generator=gen)


def _sdpa_attention(attention, x):
    """The full-attention branch as SDPA over one graph, from the module's projections."""
    n, h = x.size(0), attention.heads
    q, k, v = (lin(x).view(n, h, -1).transpose(0, 1) for lin in (attention.lin_query, attention.lin_key,
                                                                 attention.lin_value))
    return attention.lin_out(F.scaled_dot_product_attention(q, k, v).transpose(0, 1).reshape(n, -1))


def _ffn(layer, h):
    return layer.ffn_out(F.gelu(layer.ffn_in(h)))


@pytest.mark.parametrize("gate", [False, True])
def test_pre_norm_layer_normalises_the_branch_inputs_not_the_residual_stream(gate):
    torch.manual_seed(0)
    layer = GPSLayer(16, local="sage", attention="full", norm_position="pre", attn_kwargs={"gate": gate})
    layer.eval()
    if gate:
        with torch.no_grad():
            layer.attention_gate.uniform_(0.5, 1.5)
    x, edge_index, _ = _inputs()
    attended = _sdpa_attention(layer.attention, layer.norm_attn(x))
    h = x + layer.local(layer.norm_local(x), edge_index)
    h = h + (attended if not gate else layer.attention_gate * attended)
    expected = h + _ffn(layer, layer.norm_ffn(h))
    torch.testing.assert_close(layer(x, edge_index)[0], expected, atol=1e-5, rtol=1e-4)


def test_pre_norm_gatedgcn_adds_its_residuals_to_the_unnormalised_nodes_and_edges():
    torch.manual_seed(0)
    layer = GPSLayer(16, local="gatedgcn", attention="none", norm_position="pre").eval()
    x, edge_index, edge_attr = _inputs()
    # GatedGCN with its own residual on Norm(x) returns Norm(x) + x_hat and e + e_hat.
    residual_gcn = GatedGCNLayer(16, residual=True).eval()
    residual_gcn.load_state_dict(layer.local.state_dict())
    x_norm = layer.norm_local(x)
    local_out, expected_edges = residual_gcn(x_norm, edge_index, edge_attr)
    h = x + (local_out - x_norm)
    out, edges = layer(x, edge_index, edge_attr=edge_attr)
    torch.testing.assert_close(out, h + _ffn(layer, layer.norm_ffn(h)), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(edges, expected_edges)


def test_pre_norm_model_normalises_the_last_layer_once_and_trains_every_parameter():
    torch.manual_seed(0)
    x, edge_index, edge_attr = _inputs(channels=5)
    sizes = {"num_layers": 2, "edge_channels": 5, "attn_kwargs": {"k": 4}}
    model = GraphTransformer(5, 16, 3, norm_position="pre", **sizes)
    assert all(layer.norm_position == "pre" for layer in model.layers) and model.norm_out is not None
    assert GraphTransformer(5, 16, 3, **sizes).norm_out is None
    h = model.node_encoder(x)
    e = model.edge_encoder(edge_attr, edge_index.size(1))
    for layer in model.layers:
        h, e = layer(h, edge_index, edge_attr=e)
    torch.testing.assert_close(model.embed(x, edge_index, edge_attr=edge_attr), model.norm_out(h))
    model(x, edge_index, edge_attr=edge_attr).square().sum().backward()
    # The last layer's edge update reaches no output, pre-norm or not.
    trained = [(name, p) for name, p in model.named_parameters() if "layers.1.local.norm_edge" not in name]
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for _, p in trained)


def test_norm_position_is_checked_and_read_from_the_config():
    with pytest.raises(ValueError, match="norm_position must be one of"):
        GPSLayer(16, norm_position="middle")
    for form in ({"ffn": False}, {"branch_residual": False}, {"attn_kwargs": {"order": "series"}}):
        with pytest.raises(ValueError, match="needs branch_residual=True, ffn=True"):
            GPSLayer(16, norm_position="pre", **form)
    with pytest.raises(ValueError, match=r"model\.norm_position"):
        validate_config(load_config(None, ["model.norm_position=middle"]))
    data = PreparedData("node", None, None, in_channels=5, edge_channels=1, out_channels=3, name="x")
    model = build_model(load_config(None, ["model.norm_position=pre", "model.num_layers=2"]), data)
    assert [layer.norm_position == "pre" for layer in model.layers] == [True, True]
    assert "norm_position='pre'" in repr(model.layers[0])
