"""PyG baselines behind kmipgt's encoder and head: shapes, ragged batches, wiring against PyG's own parts."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data

from kmipgt.nn import BASELINE_KINDS, BaselineModel

ONE_GRAPH_KINDS = ("sgformer", "polynormer")


def _graph(num_nodes, seed=0, channels=5):
    gen = torch.Generator().manual_seed(seed)
    return Data(x=torch.randn(num_nodes, channels, generator=gen),
                edge_index=torch.randint(0, num_nodes, (2, 3 * num_nodes), generator=gen))


@pytest.mark.parametrize("kind", BASELINE_KINDS)
@pytest.mark.parametrize("task", ["node", "graph", "edge"])
def test_output_shapes_and_gradients(kind, task):
    torch.manual_seed(0)
    if task == "graph" and kind in ONE_GRAPH_KINDS:
        with pytest.raises(ValueError, match=rf"'{kind}' baseline does not support task='graph'"):
            BaselineModel(kind, 5, 16, 3, task=task)
        return
    model = BaselineModel(
        kind, 5, 16, 3, num_layers=2, task=task,
        encoder={"lappe_dim": 2, "rwse_dim": 3, "coord_columns": [0, 1], "num_frequencies": 2},
    )
    graphs = [_graph(7, seed=1), _graph(9, seed=2)] if task == "graph" else [_graph(12)]
    batch = Batch.from_data_list(graphs)
    pairs = torch.randint(0, batch.num_nodes, (2, 11))
    out = model(batch.x, batch.edge_index, batch=batch.batch if task == "graph" else None,
                lappe=torch.randn(batch.num_nodes, 2), rwse=torch.randn(batch.num_nodes, 3),
                edge_label_index=pairs)
    expected_rows = {"node": batch.num_nodes, "graph": 2, "edge": 11}[task]
    assert out.shape == (expected_rows, 3)
    out.square().sum().backward()
    assert model.node_encoder.lin_x.weight.grad.abs().sum() > 0  # gradients reach through the PyG model


@pytest.mark.parametrize("kind", ["mlp", "gcn", "sage", "gat"])
def test_ragged_batch_equals_each_graph_alone(kind):
    torch.manual_seed(0)
    model = BaselineModel(kind, 5, 16, 3, num_layers=2, task="graph", norm="batch").eval()
    graphs = [_graph(4, seed=1), _graph(9, seed=2), _graph(6, seed=3)]
    batch = Batch.from_data_list(graphs)
    together = model(batch.x, batch.edge_index, batch=batch.batch)
    alone = torch.cat([model(g.x, g.edge_index, batch=torch.zeros(g.num_nodes, dtype=torch.long))
                       for g in graphs])
    torch.testing.assert_close(together, alone, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("kind", ONE_GRAPH_KINDS)
def test_one_graph_kinds_refuse_a_batch_of_graphs(kind):
    model = BaselineModel(kind, 5, 16, 3, num_layers=1)
    batch = Batch.from_data_list([_graph(4), _graph(5, seed=1)])
    with pytest.raises(ValueError, match="one graph at a time"):
        model(batch.x, batch.edge_index, batch=batch.batch)


def test_residual_gcn_matches_a_hand_written_forward():
    torch.manual_seed(0)
    model = BaselineModel("gcn", 5, 8, 2, num_layers=2, residual=True, activation="relu").eval()
    g = _graph(10)
    h0 = model.node_encoder(g.x)
    conv0, conv1 = (wrapper.conv for wrapper in model.body.convs)
    norm0 = model.body.norms[0]
    # Node-wise LayerNorm, as in GPS layers (PyG's LayerNorm defaults to normalising the whole graph).
    h1 = F.relu(F.layer_norm(h0 + conv0(h0, g.edge_index), (8,), norm0.weight, norm0.bias))
    h2 = h1 + conv1(h1, g.edge_index)  # the last layer is plain, as in PyG's BasicGNN
    torch.testing.assert_close(model.embed(g.x, g.edge_index), h2)
    torch.testing.assert_close(model(g.x, g.edge_index), model.head(h2))
    with pytest.raises(ValueError, match="residual"):
        BaselineModel("sgformer", 5, 8, 2, residual=True)


@pytest.mark.parametrize("kind", ONE_GRAPH_KINDS)
def test_embedding_is_the_pyg_output_before_log_softmax(kind):
    torch.manual_seed(0)
    options = {"trans_num_heads": 2} if kind == "sgformer" else None
    model = BaselineModel(kind, 5, 8, 2, num_layers=2, options=options).eval()
    g = _graph(10)
    embedding = model.embed(g.x, g.edge_index)
    assert embedding.shape == (10, 8) and model._embedding is None  # no reference kept after the call
    pyg_output = model.body(model.node_encoder(g.x), g.edge_index, torch.zeros(10, dtype=torch.long))
    torch.testing.assert_close(F.log_softmax(embedding, dim=-1), pyg_output)


def test_options_reach_the_pyg_model_and_argument_errors():
    gat = BaselineModel("gat", 5, 16, 3, num_layers=2, options={"heads": 4})
    assert gat.body.convs[0].heads == 4 and gat.body.convs[0].out_channels == 4
    sgformer = BaselineModel("sgformer", 5, 16, 3, num_layers=3, options={"trans_num_layers": 1})
    assert len(sgformer.body.trans_conv.attns) == 1 and len(sgformer.body.graph_conv.convs) == 3
    assert "channels=16, num_layers=3" in repr(sgformer)
    with pytest.raises(ValueError, match="baseline kind must be one of"):
        BaselineModel("gin", 5, 16, 3)
    with pytest.raises(ValueError, match="num_layers must be >= 1"):
        BaselineModel("gcn", 5, 16, 3, num_layers=0)
    with pytest.raises(ValueError, match="Polynormer fails with heads > 1"):  # a PyG 2.8.1 bug, refused early
        BaselineModel("polynormer", 5, 16, 3, options={"heads": 2})
    with pytest.raises(ValueError, match="norm must be one of"):
        BaselineModel("sage", 5, 16, 3, norm="group")
