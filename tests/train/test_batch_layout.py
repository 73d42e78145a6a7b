"""Mini-batches of graphs reach the model with the loader's CPU ``ptr`` and their edges checked on the host;
the model asserts edge ranges without reading them on the host."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from kmipgt.nn import GraphTransformer
from kmipgt.nn.model import assert_node_pairs
from kmipgt.train.batches import batch_to_device, forward
from kmipgt.train.resident import HOST_PTR
from sync_detector import HostSyncs


def test_a_moved_batch_keeps_its_cpu_ptr_and_the_model_reads_it():
    graphs = [Data(x=torch.randn(n, 2), edge_index=torch.empty(2, 0, dtype=torch.long)) for n in (3, 5, 1)]
    batch = Batch.from_data_list(graphs)
    moved = batch_to_device(batch, torch.device("cpu"))
    assert getattr(moved, HOST_PTR).tolist() == [0, 3, 8, 9]
    model = GraphTransformer(2, 8, 1, num_layers=1, task="graph", attention="kmip", attn_kwargs={"k": 2})
    on_device = [t for k, t in moved.items() if isinstance(t, torch.Tensor) and k not in ("ptr", HOST_PTR)]
    with HostSyncs(on_device + list(model.parameters())) as syncs:
        out = forward(model, moved)
    assert out.shape == (3, 1) and syncs.syncs == []


def test_a_single_graph_moves_without_a_layout():
    graph = Data(x=torch.randn(4, 2), edge_index=torch.empty(2, 0, dtype=torch.long))
    moved = batch_to_device(graph, torch.device("cpu"))
    torch.testing.assert_close(moved.x, graph.x)


def _chain_batch() -> Batch:
    chain = torch.tensor([[0, 1, 2], [1, 2, 3]])
    return Batch.from_data_list([Data(x=torch.randn(4, 2), edge_index=chain) for _ in range(3)])


def test_edges_outside_the_batch_fail_before_the_copy():
    batch = _chain_batch()
    batch.edge_index[1, 4] = 12
    match = r"edge_index must hold node ids in \[0, 12\) for 12 nodes, got ids in \[0, 12\]"
    with pytest.raises(ValueError, match=match):
        batch_to_device(batch, torch.device("cpu"))


def test_the_model_asserts_edge_ranges_without_reading_them_on_the_host():
    moved = batch_to_device(_chain_batch(), torch.device("cpu"))
    with HostSyncs() as syncs:
        assert_node_pairs("edge_index", moved.edge_index, 12)
    assert syncs.syncs == []
    with pytest.raises(ValueError, match=r"in \[0, 11\) for 11 nodes, got ids in \[0, 11\]"):
        assert_node_pairs("edge_index", moved.edge_index, 11)
    moved.edge_index[0, 0] = -1
    with pytest.raises(ValueError, match=r"got ids in \[-1, 11\]"):
        assert_node_pairs("edge_index", moved.edge_index, 12)
