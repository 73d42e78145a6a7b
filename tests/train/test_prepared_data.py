"""Labels and graphs that would size or break a model are refused before the model is built."""

import pytest
import torch
from torch_geometric.data import Data

from kmipgt.train.config import load_config
from kmipgt.train.datasets import prepare_data


def _node_graph(y, num_nodes=4):
    """Nodes 0 and 1 train, the next validates, the others test (one node alone has no split)."""
    part = torch.tensor([0, 0, 1, 2, 2][:num_nodes])
    edge_index = torch.tensor([[0, 1], [1, 0]]) if num_nodes > 1 else torch.zeros(2, 0, dtype=torch.long)
    return Data(x=torch.rand(num_nodes, 3), edge_index=edge_index, y=y, train_mask=part == 0,
                val_mask=part == 1, test_mask=part == 2)


def _graph(y):
    return Data(x=torch.rand(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=y)


NODE = load_config(None, ["data.name=copy"])
CLASSES = load_config(None, ["data.name=copy", "task.loss=cross_entropy"])
GRAPH = load_config(None, ["data.name=copy", "task.level=graph"])


def test_the_class_count_comes_from_the_labels():
    assert prepare_data(NODE, _node_graph(torch.tensor([0, 2, 1, 2]))).out_channels == 3


@pytest.mark.parametrize(("y", "message"), [
    (torch.tensor([0, 1, 10**12, 1]),
     r"must hold class ids in \[0, 65536\), got ids in \[0, 1000000000000\]"),
    (torch.tensor([0.0, 1.5, 1.0, 1.0]), "must hold integer class ids, got torch.float32"),
])
def test_labels_out_of_range_are_refused_before_a_model_is_sized_by_them(y, message):
    with pytest.raises(ValueError, match=rf"^dataset 'copy': the training labels y {message}$"):
        prepare_data(CLASSES, _node_graph(y))


def test_a_training_node_without_a_label_is_refused():
    with pytest.raises(ValueError, match=r"^dataset 'copy': train_mask holds 1 nodes without a label"):
        prepare_data(NODE, _node_graph(torch.tensor([0, -1, 1, 1])))


def test_a_graph_without_nodes_is_refused():
    with pytest.raises(ValueError, match=r"^dataset 'copy': the graph has no nodes$"):
        prepare_data(NODE, _node_graph(torch.zeros(0, dtype=torch.long), num_nodes=0))


def test_graph_level_sets_without_labels_or_graphs_are_refused():
    splits = {split: [_graph(torch.tensor([1]))] for split in ("train", "val", "test")}
    assert prepare_data(GRAPH, splits).out_channels == 2
    with pytest.raises(ValueError, match=r"needs graphs in every split; 'val' holds none$"):
        prepare_data(GRAPH, {**splits, "val": []})
    empty = {split: [_graph(torch.zeros(0, dtype=torch.long))] for split in ("train", "val", "test")}
    with pytest.raises(ValueError, match="the training labels y holds no labels, so the number of classes"):
        prepare_data(GRAPH, empty)
