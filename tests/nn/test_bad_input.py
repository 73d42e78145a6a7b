"""Node ids out of range are rejected at the model boundary, not wrapped around (docs/reliability.md)."""

import pytest
import torch

from kmipgt.nn import BaselineModel, GraphTransformer

MODELS = {
    "gps": lambda task: GraphTransformer(5, 8, 3, num_layers=1, task=task, attn_kwargs={"heads": 2, "k": 4}),
    "gcn": lambda task: BaselineModel("gcn", 5, 8, 3, num_layers=1, task=task),
    "mlp": lambda task: BaselineModel("mlp", 5, 8, 3, num_layers=1, task=task),
}


def _graph(num_nodes=6):
    edge_index = torch.tensor([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]])
    return torch.randn(num_nodes, 5), edge_index


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize(("bad", "seen"), [(-1, r"\[-1, 5\]"), (6, r"\[0, 6\]"), (100, r"\[0, 100\]")])
def test_edge_index_outside_the_nodes_is_a_value_error(model, bad, seen):
    x, edge_index = _graph()
    edge_index[1, 2] = bad
    match = rf"edge_index must hold node ids in \[0, 6\) for 6 nodes, got ids in {seen}"
    with pytest.raises(ValueError, match=match):
        MODELS[model]("node")(x, edge_index)


@pytest.mark.parametrize("model", MODELS)
def test_edge_label_index_outside_the_nodes_is_a_value_error(model):
    x, edge_index = _graph()
    with pytest.raises(ValueError, match=r"edge_label_index must hold node ids in \[0, 6\)"):
        MODELS[model]("edge")(x, edge_index, edge_label_index=torch.tensor([[0, -2], [1, 3]]))


@pytest.mark.parametrize(
    ("edge_index", "error", "match"),
    [
        (torch.tensor([0, 1, 2]), ValueError, r"\[2, E\] tensor of node ids, got \(3,\)"),
        (torch.zeros(3, 2, dtype=torch.long), ValueError, r"\[2, E\] tensor of node ids, got \(3, 2\)"),
        (torch.zeros(2, 2), TypeError, "integer node ids"),
    ],
)
def test_edge_index_of_the_wrong_shape_or_dtype(edge_index, error, match):
    x, _ = _graph()
    with pytest.raises(error, match=match):
        MODELS["gps"]("node")(x, edge_index)


@pytest.mark.parametrize("model", MODELS)
def test_valid_and_empty_edge_index_still_run(model):
    x, edge_index = _graph()
    assert MODELS[model]("node")(x, edge_index).shape == (6, 3)
    assert MODELS[model]("node")(x, edge_index[:, :0]).shape == (6, 3)
