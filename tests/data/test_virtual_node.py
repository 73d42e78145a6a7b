"""`add_virtual_node` and `data.virtual_node`: one hub per graph, marked, checked against networkx."""

import networkx as nx
import pytest
import torch
from torch_geometric.data import Batch, Data

from kmipgt.data import add_virtual_node, virtual_node_mask
from kmipgt.train import load_config
from kmipgt.train.datasets import prepare_data


def _molecule(num_nodes: int, seed: int, edge_dim: int = 3) -> Data:
    gen = torch.Generator().manual_seed(seed)
    chain = torch.stack([torch.arange(num_nodes - 1), torch.arange(1, num_nodes)])
    edge_index = torch.cat([chain, chain.flip(0)], 1)
    graph = Data(x=torch.randn(num_nodes, 4, generator=gen), edge_index=edge_index,
                 y=torch.randint(0, 2, (1, 10), generator=gen).float(),
                 rwse=torch.randn(num_nodes, 5, generator=gen))
    if edge_dim:
        graph.edge_attr = torch.randn(edge_index.size(1), edge_dim, generator=gen)
    return graph


@pytest.mark.parametrize("edge_dim", [3, 0])
def test_the_virtual_node_joins_every_node_both_ways_and_is_marked(edge_dim):
    graph = _molecule(30, seed=1, edge_dim=edge_dim)
    out = add_virtual_node(graph)
    assert out.num_nodes == 31 and out.x.shape == (31, 5) and out.rwse.shape == (31, 5)
    assert torch.equal(out.x[:30, :4], graph.x) and torch.equal(out.rwse[:30], graph.rwse)
    assert out.x[:, 4].tolist() == [0.0] * 30 + [1.0] and out.x[30, :4].abs().sum() == 0
    assert torch.equal(out.y, graph.y)
    reference = nx.DiGraph(graph.edge_index.t().tolist())
    reference.add_edges_from((i, 30) for i in range(30))
    reference.add_edges_from((30, i) for i in range(30))
    assert set(map(tuple, out.edge_index.t().tolist())) == set(reference.edges)
    assert out.edge_index.size(1) == reference.number_of_edges()
    # The 29-hop chain is at most 2 hops across through the virtual node.
    assert nx.diameter(reference.to_undirected()) == 2
    into, out_of = out.edge_attr[:, -2], out.edge_attr[:, -1]
    source, target = out.edge_index
    assert torch.equal(into.bool(), target == 30) and torch.equal(out_of.bool(), source == 30)
    if edge_dim:
        num_edges = graph.edge_index.size(1)
        assert torch.equal(out.edge_attr[:num_edges, :edge_dim], graph.edge_attr)
        assert out.edge_attr[num_edges:, :edge_dim].abs().sum() == 0
    else:
        assert out.edge_attr.shape == (out.edge_index.size(1), 2)


def test_a_one_node_graph_keeps_its_graph_target():
    graph = Data(x=torch.randn(1, 2), edge_index=torch.zeros(2, 0, dtype=torch.long), y=torch.ones(1, 10))
    out = add_virtual_node(graph)
    assert out.num_nodes == 2 and out.y.shape == (1, 10) and out.edge_index.tolist() == [[0, 1], [1, 0]]


def test_in_a_batch_each_graph_has_its_own_virtual_node():
    graphs = [add_virtual_node(_molecule(n, seed=n)) for n in (5, 9, 7)]
    batch = Batch.from_data_list(graphs)
    source, target = batch.edge_index
    assert torch.equal(batch.batch[source], batch.batch[target])  # no edge between graphs
    hubs = batch.x[:, -1].nonzero().flatten()
    assert hubs.tolist() == [5, 15, 23]
    assert virtual_node_mask(batch).nonzero().flatten().tolist() == [5, 15, 23]
    for graph, hub in enumerate(hubs.tolist()):
        members = (batch.batch == graph).nonzero().flatten()[:-1]
        assert torch.equal(target[source == hub].sort().values, members)


def test_the_config_key_adds_a_node_per_graph_after_z_scoring(monkeypatch):
    graphs = {split: [_molecule(n, seed=n + i) for i, n in enumerate((6, 8, 5))]
              for split in ("train", "val", "test")}
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: graphs)
    task = ["task.level=graph", "task.loss=bce", "task.metric=ap"]
    prepared = prepare_data(load_config(None, [*task, "data.virtual_node=true"]))
    plain = prepare_data(load_config(None, task))
    assert prepared.in_channels == plain.in_channels + 1 and prepared.edge_channels == plain.edge_channels + 2
    for split in ("train", "val", "test"):
        for marked, original in zip(prepared.splits[split], plain.splits[split], strict=True):
            n = original.num_nodes
            assert marked.num_nodes == n + 1
            torch.testing.assert_close(marked.x[:n, :-1], original.x)  # z-scored without the hub
            assert marked.x[:, -1].tolist() == [0.0] * n + [1.0]
    with pytest.raises(ValueError, match=r"data\.virtual_node needs task\.level: graph"):
        prepare_data(load_config(None, ["data.virtual_node=true", "task.level=node"]))


def test_a_graph_level_run_with_virtual_nodes_trains(tmp_path, monkeypatch):
    from kmipgt.train import Trainer

    graphs = {split: [_molecule(5 + i % 7, seed=i) for i in range(24)] for split in ("train", "val", "test")}
    for graph in [g for split in graphs.values() for g in split]:
        graph.y = (graph.x.mean(0)[torch.arange(10) % 4] > 0).float()[None]  # learnable from a readout
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: graphs)
    config = load_config(None, [
        f"out_dir={tmp_path}", "task.level=graph", "task.loss=bce", "task.metric=ap",
        "data.virtual_node=true", "data.batch_size=8", "model.channels=16", "model.num_layers=2",
        "model.attention.k=3", "optim.lr=0.01", "optim.epochs=12", "optim.warmup_epochs=0", "device=cpu",
    ])
    trainer = Trainer(config)
    trainer.fit(progress=False)
    losses = [row["train_loss"] for row in trainer.state.history]
    assert losses[-1] < 0.8 * losses[0]
