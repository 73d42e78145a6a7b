"""GPSLayer against PyG's own GraphGPS layer: rules out a wiring defect behind the attention study."""

import itertools

import pytest
import torch
from torch_geometric.nn import GPSConv

from kmipgt.nn import GPSLayer


def _copy_attention(layer: GPSLayer, conv: GPSConv) -> None:
    """Our q/k/v/out projections into ``torch.nn.MultiheadAttention``'s packed weights."""
    attention = layer.attention
    with torch.no_grad():
        lins = (attention.lin_query, attention.lin_key, attention.lin_value)
        conv.attn.in_proj_weight.copy_(torch.cat([lin.weight for lin in lins]))
        conv.attn.in_proj_bias.copy_(torch.cat([lin.bias for lin in lins]))
        conv.attn.out_proj.weight.copy_(attention.lin_out.weight)
        conv.attn.out_proj.bias.copy_(attention.lin_out.bias)
        conv.mlp[0].load_state_dict(layer.ffn_in.state_dict())
        conv.mlp[3].load_state_dict(layer.ffn_out.state_dict())
        for ours, theirs in ((layer.norm_local, conv.norm1), (layer.norm_attn, conv.norm2),
                             (layer.norm_ffn, conv.norm3)):
            theirs.module.load_state_dict(ours.state_dict())


@pytest.mark.parametrize("local", ["gine", "sage", "gcn"])
@pytest.mark.parametrize("training", [False, True])
def test_local_mpnn_plus_full_attention_equals_pyg_gpsconv(local, training):
    torch.manual_seed(0)
    channels, heads, sizes = 16, 4, (7, 11, 5)
    batch = torch.cat([torch.full((n,), g) for g, n in enumerate(sizes)])
    ptr = [0, *torch.tensor(sizes).cumsum(0).tolist()]
    edge_index = torch.cat(
        [torch.randint(lo, hi, (2, 3 * (hi - lo))) for lo, hi in itertools.pairwise(ptr)], dim=1
    )
    x = torch.randn(ptr[-1], channels)
    edge_attr = torch.randn(edge_index.size(1), channels)
    layer = GPSLayer(
        channels, local=local, attention="full", norm="batch", activation="relu",
        attn_kwargs={"heads": heads},
    )
    conv = GPSConv(channels, layer.local, heads=heads, act="relu", norm="batch_norm")
    _copy_attention(layer, conv)
    layer.train(training)
    conv.train(training)
    edges = {"edge_attr": edge_attr} if local == "gine" else {}
    ours, _ = layer(x, edge_index, batch=batch, **edges)
    theirs = conv(x, edge_index, batch=batch, **edges)
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
