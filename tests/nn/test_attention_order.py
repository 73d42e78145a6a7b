"""The GPS layer with its attention in series: the attention's output, then the MPNN-only layer on it."""

import pytest
import torch

from kmipgt.nn import GPSLayer, GraphTransformer
from kmipgt.train import build_model, load_config
from kmipgt.train.datasets import PreparedData

FORMS = {
    "gated GAT form": ({"local": "gat", "branch_residual": False, "ffn": False}, True),
    "GraphGPS form": ({"local": "sage", "branch_residual": True, "ffn": True}, False),
}


@pytest.mark.parametrize("form", FORMS)
def test_series_is_the_mpnn_only_layer_on_the_attention_output(form):
    torch.manual_seed(0)
    options, gate = FORMS[form]
    series = GPSLayer(16, attention="kmip", **options, attn_kwargs={"order": "series", "gate": gate, "k": 6})
    series.eval()
    if series.attention_gate is not None:
        with torch.no_grad():
            series.attention_gate.uniform_(0.5, 1.5)
    mpnn_only = GPSLayer(16, attention="none", **options).eval()
    missing, unexpected = mpnn_only.load_state_dict(series.state_dict(), strict=False)
    assert not missing and unexpected
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(50, 16, generator=gen)
    edge_index = torch.randint(0, 50, (2, 200), generator=gen)
    attended = series.attention(x, edge_index)
    if series.attention_gate is not None:
        x_attended = x + series.attention_gate * attended
    else:
        x_attended = series.norm_attn(x + attended)
    torch.testing.assert_close(series(x, edge_index)[0], mpnn_only(x_attended, edge_index)[0])
    parallel = GPSLayer(16, attention="kmip", attn_kwargs={"gate": gate, "k": 6}, **options).eval()
    parallel.load_state_dict(series.state_dict())
    assert not torch.allclose(parallel(x, edge_index)[0], series(x, edge_index)[0])


def test_attention_order_is_checked_and_reaches_only_the_layers_with_attention():
    with pytest.raises(ValueError, match="attention order must be one of"):
        GPSLayer(16, attn_kwargs={"order": "serial"})
    with pytest.raises(ValueError, match="series"):
        GPSLayer(16, local="none", attn_kwargs={"order": "series"})
    with pytest.raises(ValueError, match="attention order must be one of"):
        GraphTransformer(5, 16, 2, attn_kwargs={"order": "serial"})
    config = load_config(
        None, ["model.attention.order=series", "model.attention.layers=[-1]", "model.num_layers=3"]
    )
    data = PreparedData("node", None, None, in_channels=5, edge_channels=1, out_channels=3, name="x")
    model = build_model(config, data)
    assert [layer.attention_order for layer in model.layers] == ["parallel", "parallel", "series"]
    assert "attention_order='series'" in repr(model.layers[-1])
    model = build_model(load_config(None, ["model.attention.order=series", "model.attention=none"]), data)
    assert all(layer.attention_order == "parallel" for layer in model.layers)
