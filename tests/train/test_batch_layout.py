"""Mini-batches of graphs reach the model with the layout built from the loader's CPU ``ptr``."""

from __future__ import annotations

import torch
from torch_geometric.data import Batch, Data

from kmipgt.ops.ragged import layout_of
from kmipgt.train.task import batch_to_device


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
