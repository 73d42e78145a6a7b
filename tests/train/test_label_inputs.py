"""task.label_inputs: training labels as inputs, a random share shown per step and the rest predicted."""

import pytest
import torch
from torch_geometric.data import Data

from kmipgt.data import DATASETS, Dataset
from kmipgt.train import Trainer, load_config
from kmipgt.train.datasets import prepare_data


def _cliques(num_cliques=40, size=6, num_classes=4, seed=0) -> Data:
    """Disjoint cliques, one label per clique, the same features everywhere: a node's label is known only
    through the labels of its clique mates."""
    gen = torch.Generator().manual_seed(seed)
    n = num_cliques * size
    members = torch.arange(n).view(num_cliques, size)
    src = members[:, :, None].expand(-1, -1, size).reshape(-1)
    dst = members[:, None, :].expand(-1, size, -1).reshape(-1)
    keep = src != dst
    y = torch.randint(0, num_classes, (num_cliques,), generator=gen).repeat_interleave(size)
    split = torch.rand(n, generator=gen)
    return Data(x=torch.ones(n, 3), edge_index=torch.stack([src[keep], dst[keep]]), y=y,
                train_mask=split < 0.5, val_mask=(split >= 0.5) & (split < 0.75), test_mask=split >= 0.75)


@pytest.fixture
def cliques(monkeypatch):
    monkeypatch.setitem(DATASETS, "cliques", Dataset("cliques", _cliques, ("node",), "disjoint cliques"))


def _config(tmp_path, rate, kind="gcn", epochs=60):
    return load_config(None, [
        "data.name=cliques", f"task.label_inputs={rate}", f"model.kind={kind}", "model.channels=16",
        "model.num_layers=2", f"optim.epochs={epochs}", "optim.lr=0.01", "optim.warmup_epochs=0",
        "device=cpu", "model.attention=none", f"out_dir={tmp_path}",
    ])


def test_label_columns_show_training_labels_only(tmp_path, cliques):
    plain = prepare_data(_config(tmp_path, 0.0))
    data = prepare_data(_config(tmp_path, 0.5))
    g = data.graph
    assert data.in_channels == plain.in_channels + 4 + 1
    torch.testing.assert_close(g.x[:, : plain.in_channels], plain.graph.x)
    labels = g.x[:, plain.in_channels:]
    expected = torch.nn.functional.one_hot(g.y, 4).float()
    torch.testing.assert_close(labels[g.train_mask, :4], expected[g.train_mask])
    assert (labels[g.train_mask, 4] == 1).all()
    assert (labels[~g.train_mask] == 0).all()


def test_each_step_shows_a_fresh_share_and_predicts_the_rest(tmp_path, cliques):
    trainer = Trainer(_config(tmp_path, 0.3), None)
    graph = trainer.data.graph
    train = int(graph.train_mask.sum())
    draws = []
    for _ in range(2):
        step, predicted = trainer.task.hide_labels(graph)
        shown = step.x[:, -1].bool()
        assert int(shown.sum()) == int(0.3 * train)
        assert not (shown & predicted).any() and ((shown | predicted) == graph.train_mask).all()
        torch.testing.assert_close(step.x[shown], graph.x[shown])  # shown rows keep their label columns
        assert (step.x[~shown, -5:] == 0).all()
        torch.testing.assert_close(step.x[:, :-5], graph.x[:, :-5])
        draws.append(shown)
    assert not torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("kind", ["gcn", "gps"])
def test_labels_of_neighbours_are_learnt(tmp_path, cliques, kind):
    """Every clique looks the same, so without label inputs the model can only predict one class."""
    with_labels = Trainer(_config(tmp_path / "a", 0.5, kind), None).fit(progress=False)
    without = Trainer(_config(tmp_path / "b", 0.0, kind), None).fit(progress=False)
    assert with_labels["test"] > 0.9
    majority = torch.bincount(_cliques().y).max() / _cliques().num_nodes
    assert without["test"] < majority + 0.1


def test_split_seed_redraws_the_node_split_before_labels_are_shown(tmp_path, cliques):
    own = prepare_data(_config(tmp_path, 0.5)).graph
    config = _config(tmp_path, 0.5)
    config.data.split_seed = 3
    redrawn = prepare_data(config).graph
    for mask in ("train_mask", "val_mask", "test_mask"):
        assert int(redrawn[mask].sum()) == int(own[mask].sum())
    assert not torch.equal(redrawn.train_mask, own.train_mask)
    # The label columns show the redrawn split's training labels, not the dataset's own.
    assert torch.equal(redrawn.x[:, -1].bool(), redrawn.train_mask)
    config.task.level, config.task.label_inputs = "graph", 0.0
    with pytest.raises(ValueError, match=r"data\.split_seed needs task\.level: node"):
        prepare_data(config)


def test_label_inputs_need_node_classification(tmp_path, cliques):
    config = _config(tmp_path, 0.5)
    config.task.loss = "l1"
    with pytest.raises(ValueError, match="classification"):
        prepare_data(config)
    config = _config(tmp_path, 0.5)
    config.task.level = "graph"
    with pytest.raises(ValueError, match="level: node"):
        prepare_data(config)
