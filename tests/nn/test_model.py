"""GatedGCN, GPSLayer and GraphTransformer: references, shapes, gradients, ragged batches, toy tasks."""

import copy
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Batch, Data
from torch_geometric.nn import GCNConv, SAGEConv
from torch_geometric.utils import scatter

from kmipgt.nn import FourierFeatures, GatedGCNLayer, GPSLayer, GraphTransformer
from kmipgt.nn.self_loops import StaticLoopGATConv

LOCALS = ("gatedgcn", "gine", "sage", "gcn", "none")
ATTENTIONS = ("kmip", "full", "performer", "none")  # "grf" samples walks per graph: shapes test only


def _random_graph(num_nodes, channels=6, edge_channels=3, seed=0, num_edges=None):
    gen = torch.Generator().manual_seed(seed)
    num_edges = num_edges or 3 * num_nodes
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=gen)
    return Data(
        x=torch.randn(num_nodes, channels, generator=gen),
        edge_index=edge_index,
        edge_attr=torch.randn(num_edges, edge_channels, generator=gen),
    )


def test_gated_gcn_matches_per_node_loop():
    torch.manual_seed(0)
    layer = GatedGCNLayer(8, residual=True).eval()
    graph = _random_graph(9, channels=8, edge_channels=8)
    x, e, (src, dst) = graph.x, graph.edge_attr, graph.edge_index
    out_x, out_e = layer(x, graph.edge_index, e)
    expected_x, expected_e = [], []
    for j in range(e.size(0)):
        e_hat = layer.lin_c(e[j]) + layer.lin_d(x[dst[j]]) + layer.lin_e(x[src[j]])
        expected_e.append(e[j] + F.relu(layer.norm_edge(e_hat[None]))[0])
    for i in range(x.size(0)):
        num, den = torch.zeros(8), torch.zeros(8)
        for j in range(e.size(0)):
            if dst[j] == i:
                gate = torch.sigmoid(layer.lin_c(e[j]) + layer.lin_d(x[i]) + layer.lin_e(x[src[j]]))
                num, den = num + gate * layer.lin_b(x[src[j]]), den + gate
        h = layer.lin_a(x[i]) + num / (den + 1e-6)
        expected_x.append(x[i] + F.relu(layer.norm_node(h[None]))[0])
    torch.testing.assert_close(out_x, torch.stack(expected_x), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(out_e, torch.stack(expected_e), atol=1e-5, rtol=1e-4)


def test_gated_gcn_bipartite_pair_updates_the_targets_as_the_whole_graph():
    """``(x_src, x_dst)``: targets are the first rows of the sources (a partition's own nodes before its
    halo); their outputs and edge updates equal the whole graph's (eval mode: BatchNorm's running stats)."""
    torch.manual_seed(0)
    layer = GatedGCNLayer(8, residual=True).eval()
    graph = _random_graph(12, channels=8, edge_channels=8)
    out_x, out_e = layer(graph.x, graph.edge_index, graph.edge_attr)
    kept = graph.edge_index[1] < 5
    pair_x, pair_e = layer((graph.x, graph.x[:5]), graph.edge_index[:, kept], graph.edge_attr[kept])
    torch.testing.assert_close(pair_x, out_x[:5])
    torch.testing.assert_close(pair_e, out_e[kept])


def _plain_gated_gcn(layer, x, edge_index, e):
    """GatedGCNLayer.forward as it was written before the chunked aggregation (GraphGPS's autograd form)."""
    src, dst = edge_index
    edge_hat = layer.lin_c(e) + layer.lin_d(x)[dst] + layer.lin_e(x)[src]
    gate = torch.sigmoid(edge_hat)
    num = scatter(gate * layer.lin_b(x)[src], dst, dim=0, dim_size=x.size(0), reduce="sum")
    den = scatter(gate, dst, dim=0, dim_size=x.size(0), reduce="sum")
    x_hat = layer.lin_a(x) + num / (den + 1e-6)
    x_hat = F.dropout(F.relu(layer.norm_node(x_hat)), layer.dropout, layer.training)
    edge_hat = F.dropout(F.relu(layer.norm_edge(edge_hat)), layer.dropout, layer.training)
    return x + x_hat, e + edge_hat


def test_gated_gcn_equals_its_plain_autograd_form_in_training():
    torch.manual_seed(0)
    layer = GatedGCNLayer(8, dropout=0.3).double().train()
    reference = copy.deepcopy(layer)
    graph = _random_graph(40, channels=8, edge_channels=8, num_edges=150)
    x, e = graph.x.double().requires_grad_(), graph.edge_attr.double().requires_grad_()
    outputs = []
    for module, forward in ((layer, layer), (reference, partial(_plain_gated_gcn, reference))):
        torch.manual_seed(1)  # the same dropout masks
        out_x, out_e = forward(x, graph.edge_index, e)
        loss = (out_x * torch.linspace(-1, 1, 8, dtype=torch.float64)).sum() + out_e.square().sum()
        grads = torch.autograd.grad(loss, [x, e, *module.parameters()])
        outputs.append((out_x, out_e, *grads, module.norm_edge.running_var))
    for got, expected in zip(*outputs, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)


def test_fourier_features_are_sin_cos_octaves():
    coords = torch.tensor([[1.0, -2.0]])
    out = FourierFeatures(2)(coords)
    angles = torch.tensor([0.25 * torch.pi, 0.5 * torch.pi, -0.5 * torch.pi, -torch.pi])
    torch.testing.assert_close(out, torch.cat([angles.sin(), angles.cos()])[None])


def test_fourier_kernel_peaks_only_at_the_same_position_over_standardised_range():
    grid = torch.linspace(-3.9, 3.9, 157)[:, None]
    features = FourierFeatures(6)(grid)
    kernel = features @ features.t()
    torch.testing.assert_close(kernel.argmax(1), torch.arange(157))
    off_diagonal = kernel - torch.eye(157) * kernel.diagonal()
    assert off_diagonal.max() < kernel.diagonal().min() - 0.1


@pytest.mark.parametrize("local", LOCALS)
@pytest.mark.parametrize("attention", [*ATTENTIONS, "grf"])
@pytest.mark.parametrize("norm", ["layer", "batch"])
def test_gps_layer_shapes_and_gradients(local, attention, norm):
    if local == "none" and attention == "none":
        with pytest.raises(ValueError, match="both are 'none'"):
            GPSLayer(16, local=local, attention=attention)
        return
    torch.manual_seed(0)
    options = {"heads": 4, "k": 3} if attention == "kmip" else {"heads": 4}
    layer = GPSLayer(16, local=local, attention=attention, dropout=0.1, norm=norm, attn_kwargs=options)
    graphs = [_random_graph(n, channels=16, edge_channels=16, seed=n) for n in (6, 9)]
    batch = Batch.from_data_list(graphs)
    x = batch.x.clone().requires_grad_(True)
    edge_attr = batch.edge_attr.clone().requires_grad_(True)
    out, out_edge = layer(x, batch.edge_index, batch=batch.batch, edge_attr=edge_attr)
    assert out.shape == x.shape and out_edge.shape == edge_attr.shape
    (out.square().sum() + out_edge.square().sum()).backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, param in layer.named_parameters():
        assert param.grad is not None, name


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("task", ["node", "graph"])
def test_ragged_batch_equals_each_graph_alone(attention, task):
    torch.manual_seed(0)
    model = GraphTransformer(
        6, 16, 3, num_layers=2, task=task, edge_channels=3, attention=attention,
        encoder={"coord_columns": [0, 1], "num_frequencies": 3},
        attn_kwargs={"heads": 4, **({"k": 4} if attention == "kmip" else {})},
    ).eval()
    graphs = [_random_graph(n, seed=n) for n in (10, 3, 7)]
    batch = Batch.from_data_list(graphs)
    together = model(batch.x, batch.edge_index, batch.batch, batch.edge_attr)
    alone = torch.cat([model(g.x, g.edge_index, None, g.edge_attr) for g in graphs])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


def _train(model, step_inputs, target, loss_fn, steps=40, lr=1e-2):
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn(model(**step_inputs), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_graph_level_toy_task_learns():
    """Label = majority node type (one-hot features): needs pooling over the whole graph."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(1)
    graphs = []
    for _ in range(24):
        n = int(torch.randint(4, 12, (1,), generator=gen))
        types = torch.randint(0, 3, (n,), generator=gen)
        g = _random_graph(n, seed=int(torch.randint(0, 10**6, (1,), generator=gen)))
        g.x = F.one_hot(types, 3).float()
        g.edge_attr = None
        g.y = torch.bincount(types, minlength=3).argmax().view(1)
        graphs.append(g)
    batch = Batch.from_data_list(graphs)
    model = GraphTransformer(
        3, 32, 3, num_layers=2, task="graph", attention="kmip", attn_kwargs={"heads": 4, "k": 4},
    )
    inputs = {"x": batch.x, "edge_index": batch.edge_index, "batch": batch.batch}
    losses = _train(model, inputs, batch.y, F.cross_entropy)
    assert losses[-1] < 0.25 * losses[0]


def test_edge_level_toy_task_learns():
    """Link label = both endpoints in the same community (the community is in the node features)."""
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(2)
    n = 40
    community = torch.randint(0, 4, (n,), generator=gen)
    graph = _random_graph(n, channels=4, seed=3)
    pairs = torch.randint(0, n, (2, 200), generator=gen)
    target = (community[pairs[0]] == community[pairs[1]]).float().unsqueeze(-1)
    model = GraphTransformer(
        4, 32, 1, num_layers=1, task="edge", attention="kmip", attn_kwargs={"heads": 4, "k": 8},
    )
    inputs = {
        "x": F.one_hot(community, 4).float(), "edge_index": graph.edge_index, "edge_label_index": pairs,
    }
    losses = _train(model, inputs, target, F.binary_cross_entropy_with_logits)
    assert losses[-1] < 0.25 * losses[0]


def test_graph_transformer_argument_errors():
    with pytest.raises(ValueError, match="task"):
        GraphTransformer(3, 16, 2, task="link")
    with pytest.raises(ValueError, match="coord_columns"):
        GraphTransformer(3, 16, 2, encoder={"coord_columns": [5], "num_frequencies": 2})
    model = GraphTransformer(3, 16, 2, task="edge", attn_kwargs={"k": 2})
    with pytest.raises(ValueError, match="edge_label_index"):
        model(torch.randn(4, 3), torch.tensor([[0, 1], [1, 2]]))


@pytest.mark.parametrize("attention", ["kmip", "full", "performer", "grf"])
def test_activation_checkpointing_equals_plain_run(attention):
    graph = _random_graph(40)
    graph.x[:, :2] = torch.rand(40, 2)  # coordinates for the position-keyed queries and keys
    losses, grads = [], []
    for checkpoint in (False, True):
        torch.manual_seed(0)
        model = GraphTransformer(
            6, 16, 3, num_layers=3, edge_channels=3, attention=attention, dropout=0.3, checkpoint=checkpoint,
            encoder={"coord_columns": [0, 1], "num_frequencies": 3, "attention_qk": "position"},
            attn_kwargs={"dropout": 0.0 if attention == "grf" else 0.2,
                         **{"kmip": {"k": 5}, "grf": {"seed": 3}}.get(attention, {})},
        ).train()
        torch.manual_seed(1)  # the same dropout masks in both runs
        loss = model(graph.x, graph.edge_index, edge_attr=graph.edge_attr).square().mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append({name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None})
    torch.testing.assert_close(losses[1], losses[0])
    assert grads[0].keys() == grads[1].keys() and len(grads[0]) > 10
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], msg=name)


def test_activation_checkpointing_saves_fewer_activations():
    graph = _random_graph(200)
    saved = []
    for checkpoint in (False, True):
        torch.manual_seed(0)
        model = GraphTransformer(
            6, 32, 3, num_layers=4, edge_channels=3, attn_kwargs={"k": 8}, checkpoint=checkpoint
        ).train()
        numel = []

        def pack(tensor, numel=numel):
            numel.append(tensor.numel())
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            model(graph.x, graph.edge_index, edge_attr=graph.edge_attr)
        saved.append(sum(numel))
    assert saved[1] < saved[0] / 3


@pytest.mark.parametrize("attention", ["none", "kmip"])
def test_gps_layer_without_residual_and_ffn_is_a_gcn_layer_plus_attention(attention):
    torch.manual_seed(0)
    graph = _random_graph(30, channels=16)
    k = {"k": 4} if attention == "kmip" else None
    layer = GPSLayer(16, local="gcn", attention=attention, branch_residual=False, ffn=False, attn_kwargs=k)
    layer.eval()
    out, _ = layer(graph.x, graph.edge_index)
    expected = layer.norm_local(layer.local(graph.x, graph.edge_index))
    if attention != "none":
        expected = expected + layer.norm_attn(layer.attention(graph.x))
    torch.testing.assert_close(out, F.gelu(expected))
    assert not any(name.startswith(("ffn", "norm_ffn")) for name, _ in layer.named_parameters())


@pytest.mark.parametrize("local", ["sage", "gcn", "gat"])
def test_gps_layer_without_ffn_drops_out_once_like_pyg(local):
    """In training, the layer without residual and FFN is PyG's BasicGNN step: conv, norm, activation,
    one dropout (dropping the branch before the norm as well would drop it twice); GAT's attention
    coefficients are dropped inside the conv, as PyG's GAT does (its conv is kmipgt's, which equals PyG's
    in evaluation, tests/nn/test_self_loops.py, and draws its dropout over other edge rows)."""
    graph = _random_graph(40, channels=16)
    layer = GPSLayer(16, local=local, attention="none", dropout=0.5, branch_residual=False, ffn=False)
    conv = {"sage": SAGEConv, "gcn": GCNConv, "gat": partial(StaticLoopGATConv, dropout=0.5)}[local](16, 16)
    conv.load_state_dict(layer.local.state_dict())
    norm = torch.nn.LayerNorm(16)
    norm.load_state_dict(layer.norm_local.state_dict())
    torch.manual_seed(3)
    out, _ = layer.train()(graph.x, graph.edge_index)
    torch.manual_seed(3)
    expected = F.dropout(F.gelu(norm(conv(graph.x, graph.edge_index))), 0.5, training=True)
    torch.testing.assert_close(out, expected)


def test_gps_layer_branch_residual_reaches_gated_gcn():
    assert GPSLayer(8, local="gatedgcn", attention="none").local.residual
    assert not GPSLayer(8, local="gatedgcn", attention="none", branch_residual=False).local.residual


def test_attention_gate_is_ignored_without_attention():
    graph = _random_graph(20)
    models = []
    for gate in (False, True):
        torch.manual_seed(0)
        model = GraphTransformer(6, 16, 3, edge_channels=3, attention="none", attn_kwargs={"gate": gate})
        models.append(model.eval())
    out = [m(graph.x, graph.edge_index, edge_attr=graph.edge_attr) for m in models]
    torch.testing.assert_close(out[1], out[0])
