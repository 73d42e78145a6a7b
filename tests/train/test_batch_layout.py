"""Mini-batches of graphs reach the model with the layout built from the loader's CPU ``ptr`` and their edges
checked on the host."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch, Data

from kmipgt.nn.model import check_node_pairs, mark_node_pairs_checked
from kmipgt.ops.ragged import layout_of
from kmipgt.train.task import batch_to_device
from sync_detector import HostSyncs


def test_a_moved_batch_carries_the_layout_of_its_cpu_ptr():
    graphs = [Data(x=torch.randn(n, 2), edge_index=torch.empty(2, 0, dtype=torch.long)) for n in (3, 5, 1)]
    batch = Batch.from_data_list(graphs)
    moved = batch_to_device(batch, torch.device("cpu"))
    layout = layout_of(moved.num_nodes, torch.device("cpu"), moved.batch)
    assert layout.ptr.tolist() == [0, 3, 8, 9] and layout.max_nodes == 5
    assert layout_of(moved.num_nodes, torch.device("cpu"), moved.batch) is layout


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


def test_the_model_does_not_read_moved_edges_again_until_they_change():
    moved = batch_to_device(_chain_batch(), torch.device("cpu"))
    with HostSyncs() as syncs:
        check_node_pairs("edge_index", moved.edge_index, 12)
    assert syncs.syncs == []
    with HostSyncs() as syncs:
        check_node_pairs("edge_index", moved.edge_index.clone(), 12)  # a copy not checked on the host
    assert syncs.syncs
    with pytest.raises(ValueError, match=r"in \[0, 11\) for 11 nodes"):
        check_node_pairs("edge_index", moved.edge_index, 11)  # fewer nodes than the edges were checked for
    moved.edge_index[0, 0] = -1
    with pytest.raises(ValueError, match=r"got ids in \[-1, 11\]"):
        check_node_pairs("edge_index", moved.edge_index, 12)


def test_an_inference_tensor_is_checked_every_time():
    with torch.inference_mode():
        edges = torch.tensor([[0, 1], [1, 2]])
        mark_node_pairs_checked(edges, 3)
        edges[0, 0] = 7  # inference tensors count no changes, so a mark could not be trusted
    with pytest.raises(ValueError, match=r"got ids in \[1, 7\]"):
        check_node_pairs("edge_index", edges, 3)
