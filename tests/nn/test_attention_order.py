"""The GPS layer with its attention in series: the attention's output, then the MPNN-only layer on it."""

import pytest
import torch

from kmipgt.nn import GPSLayer, GraphTransformer
from kmipgt.train import build_model, load_config
from kmipgt.train.datasets import PreparedData

FORMS = {
    "gated GAT form": {"local": "gat", "attention_gate": True, "branch_residual": False, "ffn": False},
    "GraphGPS form": {"local": "sage", "attention_gate": False, "branch_residual": True, "ffn": True},
}


@pytest.mark.parametrize("form", FORMS)
def test_series_is_the_mpnn_only_layer_on_the_attention_output(form):
    torch.manual_seed(0)
    options = FORMS[form]
    series = GPSLayer(16, attention="kmip", attn_kwargs={"k": 6}, attention_order="series", **options).eval()
    if series.attention_gate is not None:
        with torch.no_grad():
            series.attention_gate.uniform_(0.5, 1.5)
    mpnn_only = GPSLayer(16, attention="none", **{**options, "attention_gate": False}).eval()
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
    parallel = GPSLayer(16, attention="kmip", attn_kwargs={"k": 6}, **options).eval()
    parallel.load_state_dict(series.state_dict())
    assert not torch.allclose(parallel(x, edge_index)[0], series(x, edge_index)[0])


def test_attention_order_is_checked_and_reaches_only_the_layers_with_attention():
    with pytest.raises(ValueError, match="attention_order"):
        GPSLayer(16, attention_order="serial")
    with pytest.raises(ValueError, match="series"):
        GPSLayer(16, local="none", attention_order="series")
    with pytest.raises(ValueError, match="attention_order"):
        GraphTransformer(5, 16, 2, attention_order="serial")
    config = load_config(
        None, ["model.attention_order=series", "model.attention_layers=[-1]", "model.num_layers=3"]
    )
    data = PreparedData("node", None, None, in_channels=5, edge_channels=1, out_channels=3, name="x")
    model = build_model(config, data)
    assert [layer.attention_order for layer in model.layers] == ["parallel", "parallel", "series"]
    assert "attention_order='series'" in repr(model.layers[-1])
    model = build_model(load_config(None, ["model.attention_order=series", "model.attention=none"]), data)
    assert all(layer.attention_order == "parallel" for layer in model.layers)
