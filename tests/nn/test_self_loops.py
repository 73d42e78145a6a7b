"""GCN and GAT with self-loops built in value-independent shapes equal PyG's layers, which add them with a
boolean mask: on graphs with and without loops, repeated loops, isolated nodes and bipartite pairs."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.nn import GATConv, GCNConv

from kmipgt.nn.self_loops import StaticLoopGATConv, StaticLoopGCNConv, loops_replaced


def _graph(num_nodes: int, num_edges: int, loops: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, num_nodes, (2, num_edges), generator=generator)
    looped = torch.randint(0, num_nodes, (loops,), generator=generator)
    return torch.cat([edges, looped.expand(2, -1), looped[:1].expand(2, -1)], dim=1)  # a node looped twice


PAIRS = [(StaticLoopGCNConv, GCNConv, {}), (StaticLoopGATConv, GATConv, {}),
         (StaticLoopGATConv, GATConv, {"heads": 3, "concat": True})]


@pytest.mark.parametrize(("ours", "pyg", "options"), PAIRS)
@pytest.mark.parametrize("loops", [0, 4])
def test_the_layers_equal_pyg_with_its_own_self_loops(ours, pyg, options, loops):
    torch.manual_seed(0)
    reference = pyg(6, 5, **options).eval()
    layer = ours(6, 5, **options).eval()
    layer.load_state_dict(reference.state_dict())
    edge_index = _graph(20, 50, loops, seed=loops)  # some of the 20 nodes have no edge at all
    x = torch.randn(20, 6)
    torch.testing.assert_close(layer(x, edge_index), reference(x, edge_index), rtol=1e-5, atol=1e-6)


def test_gat_on_a_bipartite_pair_equals_pyg():
    torch.manual_seed(1)
    reference = GATConv((6, 6), 5).eval()
    layer = StaticLoopGATConv((6, 6), 5).eval()
    layer.load_state_dict(reference.state_dict())
    x_src, x_dst = torch.randn(12, 6), torch.randn(8, 6)
    generator = torch.Generator().manual_seed(2)
    edge_index = torch.stack([torch.randint(0, 12, (30,), generator=generator),
                              torch.randint(0, 8, (30,), generator=generator)])
    edge_index[:, :3] = torch.tensor([[1, 2, 3], [1, 2, 3]])
    torch.testing.assert_close(layer((x_src, x_dst), edge_index), reference((x_src, x_dst), edge_index),
                               rtol=1e-5, atol=1e-6)


def test_loops_are_redirected_to_the_extra_row_and_one_is_added_per_node():
    edge_index = torch.tensor([[0, 1, 2, 2], [1, 1, 0, 2]])
    expected = torch.tensor([[0, 1, 2, 2, 0, 1, 2], [1, 3, 0, 3, 0, 1, 2]])
    assert torch.equal(loops_replaced(edge_index, 3, 3), expected)


def test_the_parameter_names_are_pyg_s():
    assert list(StaticLoopGCNConv(4, 4).state_dict()) == list(GCNConv(4, 4).state_dict())
    assert list(StaticLoopGATConv(4, 4).state_dict()) == list(GATConv(4, 4).state_dict())
