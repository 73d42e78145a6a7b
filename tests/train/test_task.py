"""Task levels (kmipgt.train.tasks): steps, loss inputs, targets and split outputs vs direct computations."""

import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data
from torch_geometric.loader import DataLoader

from kmipgt.train import load_config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.losses import LOSSES, compute_loss
from kmipgt.train.tasks.graph import GraphTask
from kmipgt.train.tasks.levels import make_task
from kmipgt.train.tasks.link import LinkTask, with_fresh_negatives
from kmipgt.train.tasks.node import NodeTask


def _masks(n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    order = torch.randperm(n, generator=gen)
    return {
        f"{split}_mask": torch.zeros(n, dtype=torch.bool).index_fill_(0, part, True)
        for split, part in zip(("train", "val", "test"), order.tensor_split(3), strict=True)
    }


def _node_data(n=30, classes=3) -> PreparedData:
    gen = torch.Generator().manual_seed(0)
    edge_index = torch.randint(0, n, (2, 3 * n), generator=gen)
    graph = Data(x=torch.randn(n, 4, generator=gen), edge_index=edge_index,
                 y=torch.randint(0, classes, (n,), generator=gen), **_masks(n, gen))
    return PreparedData("node", graph, None, in_channels=4, edge_channels=0, out_channels=classes, name="toy")


def _graph_data(num_graphs=13) -> PreparedData:
    gen = torch.Generator().manual_seed(1)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(2, 7, (1,), generator=gen))
        edge_index = torch.randint(0, n, (2, n), generator=gen)
        graphs.append(Data(x=torch.randn(n, 2, generator=gen), edge_index=edge_index,
                           y=torch.randint(0, 2, (1,), generator=gen)))
    splits = {"train": graphs[:7], "val": graphs[7:10], "test": graphs[10:]}
    return PreparedData("graph", None, splits, in_channels=2, edge_channels=0, out_channels=2, name="toy")


def _link_graph(gen: torch.Generator, n=20) -> Data:
    """A ring (message-passing edges) scoring chords (positives) and other pairs (negatives)."""
    ring = torch.stack([torch.arange(n), (torch.arange(n) + 1) % n])
    pairs = torch.randint(0, n, (2, 12), generator=gen)
    return Data(x=torch.randn(n, 3, generator=gen), edge_index=torch.cat([ring, ring.flip(0)], 1),
                edge_label_index=pairs, edge_label=(torch.arange(12) % 2 == 0).float())


def _link_data() -> PreparedData:
    gen = torch.Generator().manual_seed(2)
    splits = {split: [_link_graph(gen)] for split in ("train", "val", "test")}
    return PreparedData("edge", None, splits, in_channels=3, edge_channels=0, out_channels=1, name="toy")


def _config(level, *extra):
    return load_config(None, [f"task.level={level}", "data.batch_size=3", *extra])


def _node_scores(graph: Data) -> torch.Tensor:
    """A stand-in model: three logits per node from its features."""
    return graph.x[:, :3] * 2.0


def _graph_scores(batch: Data) -> torch.Tensor:
    """A stand-in model: the mean of each graph's features as two logits."""
    sums = torch.zeros(batch.num_graphs, 2).index_add_(0, batch.batch, batch.x)
    return sums / torch.bincount(batch.batch, minlength=batch.num_graphs).unsqueeze(1)


def _pair_scores(graph: Data) -> torch.Tensor:
    """A stand-in model: the inner product of each scored pair's features."""
    src, dst = graph.edge_label_index
    return (graph.x[src] * graph.x[dst]).sum(-1, keepdim=True)


def _generator(seed=0):
    return torch.Generator().manual_seed(seed)


def test_losses_match_torch():
    output, classes = torch.randn(6, 3), torch.tensor([0, 2, 1, 1, 0, 2])
    torch.testing.assert_close(compute_loss("cross_entropy", output, classes),
                               F.cross_entropy(output, classes))
    labels = (torch.rand(6, 3) > 0.5).long()
    torch.testing.assert_close(compute_loss("bce", output, labels),
                               F.binary_cross_entropy_with_logits(output, labels.float()))
    torch.testing.assert_close(compute_loss("l1", output[:, :1], output[:, 1]),
                               (output[:, 0] - output[:, 1]).abs().mean())
    assert LOSSES == ("cross_entropy", "bce", "l1")
    with pytest.raises(ValueError, match=r"task\.loss must be one of"):
        compute_loss("mse", output, classes)


def test_node_task_trains_on_the_training_mask_and_scores_each_mask():
    data = _node_data()
    task = make_task(_config("node"), data, _generator())
    assert isinstance(task, NodeTask) and task.steps_per_epoch() == 1
    graph = data.graph
    [step] = task.train_steps(torch.device("cpu"))
    output, target = task.loss_inputs(_node_scores(step.batch), step)
    mask = graph.train_mask
    torch.testing.assert_close(compute_loss("cross_entropy", output, target),
                               F.cross_entropy(_node_scores(graph)[mask], graph.y[mask]))
    splits = task.split_outputs(_node_scores, ("train", "val", "test"), torch.device("cpu"))
    for split, output, target in splits:
        mask = graph[f"{split}_mask"]
        torch.testing.assert_close(output, _node_scores(graph)[mask])
        assert torch.equal(target, graph.y[mask])
    assert task.token_graph() is graph


def test_node_task_with_label_inputs_draws_from_the_run_generator():
    data = _node_data()
    data.graph.x = torch.cat([data.graph.x, torch.zeros(data.graph.num_nodes, 4)], 1)  # 3 classes + shown
    task = make_task(_config("node", "task.label_inputs=0.5"), data, _generator(7))
    [step] = task.train_steps(torch.device("cpu"))
    expected_batch, expected_mask = NodeTask(task.config, data, _generator(7)).hide_labels(data.graph)
    assert torch.equal(step.mask, expected_mask) and torch.equal(step.batch.x, expected_batch.x)
    assert step.mask.sum() < data.graph.train_mask.sum()


def test_graph_task_steps_through_shuffled_mini_batches():
    data = _graph_data()
    task = make_task(_config("graph"), data, _generator(3))
    assert isinstance(task, GraphTask) and task.steps_per_epoch() == math.ceil(7 / 3)
    steps = list(task.train_steps(torch.device("cpu")))
    reference = DataLoader(data.splits["train"], batch_size=3, shuffle=True, generator=_generator(3))
    assert len(steps) == task.steps_per_epoch()
    for step, batch in zip(steps, reference, strict=True):
        assert step.mask is None
        output, target = task.loss_inputs(_graph_scores(step.batch), step)
        assert torch.equal(target, batch.y)
        torch.testing.assert_close(compute_loss("cross_entropy", output, target),
                                   F.cross_entropy(_graph_scores(batch), batch.y))
    for split, output, target in task.split_outputs(_graph_scores, ("val", "test"), torch.device("cpu")):
        graphs = data.splits[split]
        one_by_one = torch.stack([graph.x.mean(0) for graph in graphs])
        torch.testing.assert_close(output, one_by_one)
        assert torch.equal(target, torch.cat([graph.y for graph in graphs]))
    assert task.token_graph() is data.splits["test"][0]


def test_link_task_scores_fresh_negatives_and_held_out_pairs():
    data = _link_data()
    task = make_task(_config("edge", "task.loss=bce"), data, _generator())
    assert isinstance(task, LinkTask) and task.steps_per_epoch() == 1
    train = data.splits["train"][0]
    states = random.getstate(), torch.random.get_rng_state()
    [step] = task.train_steps(torch.device("cpu"))
    random.setstate(states[0])
    torch.random.set_rng_state(states[1])
    expected = with_fresh_negatives(train)
    assert torch.equal(step.batch.edge_label_index, expected.edge_label_index)
    output, target = task.loss_inputs(_pair_scores(step.batch), step)
    assert torch.equal(target, step.batch.edge_label)
    positives = train.edge_label_index[:, train.edge_label == 1]
    assert torch.equal(step.batch.edge_label_index[:, target == 1], positives)
    torch.testing.assert_close(compute_loss("bce", output, target),
                               F.binary_cross_entropy_with_logits(output.view(-1), target.float()))
    for split, output, target in task.split_outputs(_pair_scores, ("val",), torch.device("cpu")):
        graph = data.splits[split][0]
        torch.testing.assert_close(output, _pair_scores(graph))
        assert torch.equal(target, graph.edge_label)


def test_split_graphs_and_unknown_levels():
    node = make_task(_config("node"), _node_data(), _generator()).split_graph("val")
    assert torch.equal(node.nodes, node.graph.val_mask.nonzero().flatten()) and node.labels is not None
    graph = make_task(_config("graph"), _graph_data(), _generator()).split_graph("test", 1)
    assert torch.equal(graph.nodes, torch.arange(graph.graph.num_nodes)) and graph.train_mask is None
    with pytest.raises(ValueError, match="graph 5 does not exist"):
        make_task(_config("graph"), _graph_data(), _generator()).split_graph("test", 5)
    with pytest.raises(ValueError, match="split must be one of"):
        make_task(_config("node"), _node_data(), _generator()).split_graph("dev")
    data = _node_data()
    data.level = "hyperedge"
    with pytest.raises(ValueError, match="task level must be one of"):
        make_task(_config("node"), data, _generator())

