"""Node-level tasks over a set of graphs (inductive segmentation): batches, loss and metrics per node."""

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.data import Data

from kmipgt.train import load_config
from kmipgt.train.datasets import prepare_data
from kmipgt.train.loop import Trainer
from kmipgt.train.tasks.levels import make_task
from kmipgt.train.tasks.node_batch import NodeBatchTask


def _segmented_graphs(num_graphs: int, seed: int) -> list[Data]:
    """Graphs of 5 to 9 nodes whose every node is labelled by the sign of its first feature."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(num_graphs):
        n = int(torch.randint(5, 10, (1,), generator=gen))
        x = torch.randn(n, 3, generator=gen)
        graphs.append(Data(x=x, edge_index=torch.randint(0, n, (2, 2 * n), generator=gen),
                           y=(x[:, 0] > 0).long()))
    return graphs


def _raw():
    return {"train": _segmented_graphs(6, 0), "val": _segmented_graphs(3, 1), "test": _segmented_graphs(3, 2)}


def _config(tmp_path):
    return load_config(None, [
        f"out_dir={tmp_path}", "task.level=node", "data.batch_size=4", "data.normalize_features=false",
        "model.channels=8", "model.num_layers=1", "model.attention.k=3", "optim.epochs=1",
        "optim.warmup_epochs=0",
        "device=cpu",
    ])


def test_node_level_over_a_set_of_graphs_scores_every_node(tmp_path):
    config = _config(tmp_path)
    raw = _raw()
    data = prepare_data(config, raw)
    assert data.level == "node" and data.graph is None and data.out_channels == 2
    task = make_task(config, data, torch.Generator().manual_seed(0))
    assert isinstance(task, NodeBatchTask) and task.steps_per_epoch() == 2
    steps = list(task.train_steps(torch.device("cpu")))
    assert sum(step.batch.num_nodes for step in steps) == sum(g.num_nodes for g in raw["train"])
    assert all(step.mask is None for step in steps)

    def predict(batch):  # a per-node "model": logits from the first feature
        return torch.stack([-batch.x[:, 0], batch.x[:, 0]], 1)

    for split, output, target in task.split_outputs(predict, ("train", "val", "test"), torch.device("cpu")):
        x = torch.cat([g.x for g in raw[split]])
        assert torch.equal(target, torch.cat([g.y for g in raw[split]]))
        assert torch.equal(output.argmax(1), (x[:, 0] > 0).long())
    output, target = task.loss_inputs(predict(steps[0].batch), steps[0])
    assert output.shape == (steps[0].batch.num_nodes, 2)
    assert torch.isfinite(F.cross_entropy(output, target))


def test_trainer_trains_per_node_outputs_over_batches(tmp_path):
    config = _config(tmp_path)
    trainer = Trainer(config, data=prepare_data(config, _raw()))
    metrics = trainer.fit()
    assert set(metrics) >= {"train", "val", "test"} and 0.0 <= metrics["test"] <= 1.0
    batch = next(iter(trainer.task.eval_batches("test")))
    assert trainer.model(batch.x, batch.edge_index, batch=batch.batch).shape == (batch.num_nodes, 2)


def test_set_of_graphs_without_node_labels_is_refused(tmp_path):
    raw = _raw()
    raw["val"][0].y = torch.tensor([1])
    with pytest.raises(ValueError, match="label per node"):
        prepare_data(_config(tmp_path), raw)
    with pytest.raises(ValueError, match="set of graphs"):
        prepare_data(load_config(None, [f"out_dir={tmp_path}", "data.split_seed=1"]), _raw())


def test_one_graph_tools_refuse_a_set_of_graphs(tmp_path):
    from kmipgt.distributed.launch import Ranks
    from kmipgt.train.partitioned import partition_graph

    config = _config(tmp_path)
    with pytest.raises(ValueError, match="set of graphs"):
        partition_graph(config, prepare_data(config, _raw()), Ranks(rank=0, size=2, local_rank=0))
