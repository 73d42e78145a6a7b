"""Training: config loading and overrides, metrics, exact resume, run outputs, the CLI."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import f1_score
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from kmipgt.cli import main
from kmipgt.data import list_datasets
from kmipgt.nn import BASELINE_KINDS, BaselineModel
from kmipgt.train import Trainer, build_model, load_config, stepper
from kmipgt.train.batches import forward as _forward
from kmipgt.train.checkpoint import load_checkpoint
from kmipgt.train.datasets import PreparedData
from kmipgt.train.metrics import compute_metric, higher_is_better
from kmipgt.train.tokens import save_first_layer_tokens
from tiny_runs import sign_graphs


def test_config_file_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  attention: {k: 8}\n  channels: 32\noptim:\n  lr: 0.01\n")
    overrides = ["model.attention.k=64", "optim.lr=1", "model.attention.head_dim=null",
                 "data.options={root: /d}"]
    config = load_config(path, overrides)
    assert config.model.attention.k == 64 and config.model.channels == 32
    assert config.optim.lr == 1.0 and isinstance(config.optim.lr, float)
    assert config.model.attention.head_dim is None and config.data.options == {"root": "/d"}
    assert config.model.attention.kind == "kmip"  # untouched default
    with pytest.raises(ValueError, match="unknown config keys in 'model'"):
        load_config(path, ["model.kk=3"])
    with pytest.raises(TypeError, match=r"model\.attention\.k"):
        load_config(path, ["model.attention.k=1.5"])
    with pytest.raises(ValueError, match=r"key\.sub=value"):
        load_config(path, ["model.attention.k"])


def test_metrics_against_references():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    target = torch.tensor([0, 1, 1, 2])
    assert compute_metric("accuracy", logits, target) == pytest.approx(0.5)
    assert compute_metric("macro_f1", logits, target) == pytest.approx(
        f1_score([0, 1, 1, 2], [0, 1, 2, 0], average="macro")
    )
    # two labels, perfect ranking on the first; the second has one positive ranked second of three
    scores = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.1, 0.9]])
    labels = torch.tensor([[1, 0], [0, 1], [0, 0]])
    assert compute_metric("ap", scores, labels) == pytest.approx((1.0 + 0.5) / 2)
    assert compute_metric("mae", torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])) == pytest.approx(1.5)
    assert higher_is_better("ap") and not higher_is_better("mae")
    with pytest.raises(ValueError, match="metric"):
        compute_metric("auc", logits, target)


def _toy_graph_data(num_graphs=24, seed=0) -> PreparedData:
    graphs = sign_graphs(num_graphs, seed, edge_dim=2)
    splits = {"train": graphs[:16], "val": graphs[16:20], "test": graphs[20:]}
    return PreparedData("graph", None, splits, in_channels=4, edge_channels=2, out_channels=2, name="toy")


def _toy_config(out_dir, attention="performer"):
    return load_config(None, [
        f"out_dir={out_dir}", "task.level=graph", "data.batch_size=5", "optim.epochs=4",
        "optim.warmup_epochs=1", "model.channels=16", "model.num_layers=2", f"model.attention={attention}",
        "model.attention.k=3", "model.dropout=0.2", "model.attention.dropout=0.1", "device=cpu",
    ])


def test_resume_equals_uninterrupted(tmp_path):
    data = _toy_graph_data()
    straight = Trainer(_toy_config(tmp_path / "a"), data)
    full_metrics = straight.fit(progress=False)

    interrupted = Trainer(_toy_config(tmp_path / "b"), data)
    partial = interrupted.fit(stop_after=2, progress=False)
    assert partial == {"epochs_done": 2, "complete": False}
    resumed = Trainer(_toy_config(tmp_path / "b"), data)
    resumed.resume()
    resumed_metrics = resumed.fit(progress=False)

    for key, value in straight.model.state_dict().items():
        torch.testing.assert_close(resumed.model.state_dict()[key], value, atol=0, rtol=0)
    losses = [[r["train_loss"] for r in t.state.history] for t in (straight, resumed)]
    assert losses[0] == losses[1]
    for key in ("train", "val", "test", "best_epoch"):
        assert resumed_metrics[key] == full_metrics[key]


@pytest.mark.parametrize("attention", ["kmip", "full", "performer", "grf", "none"])
def test_every_attention_kind_trains_through_the_trainer(tmp_path, attention):
    # Per-epoch hooks (e.g. random-feature redraws) must work for every kind, not only in module tests.
    config = load_config(None, [
        f"out_dir={tmp_path}", "task.level=graph", "data.batch_size=8", "optim.epochs=2",
        "optim.warmup_epochs=1", "model.channels=16", "model.num_layers=1", f"model.attention={attention}",
        "model.attention.k=3", "model.attention.dropout=0.0", "device=cpu",
    ])
    metrics = Trainer(config, _toy_graph_data()).fit(progress=False)
    assert metrics["complete"] and 0.0 <= metrics["test"] <= 1.0


def test_threads_must_be_positive(tmp_path):
    config = _toy_config(tmp_path)
    config.threads = 0
    with pytest.raises(ValueError, match="threads"):
        Trainer(config, _toy_graph_data())


def test_a_moved_run_resumes_from_its_new_folder(tmp_path):
    data = _toy_graph_data()
    Trainer(_toy_config(tmp_path / "here"), data).fit(stop_after=2, progress=False)
    (tmp_path / "here").rename(tmp_path / "there")  # or unpacked on another machine
    resumed = Trainer(_toy_config(tmp_path / "there"), data)
    resumed.resume()
    assert resumed.state.epoch == 2 and resumed.fit(progress=False)["complete"]


def test_resume_rejects_a_different_config(tmp_path):
    data = _toy_graph_data()
    Trainer(_toy_config(tmp_path), data).fit(stop_after=1, progress=False)
    with pytest.raises(ValueError, match="config differs"):
        Trainer(_toy_config(tmp_path, attention="kmip"), data).resume()


def test_run_outputs_and_tokens(tmp_path):
    trainer = Trainer(_toy_config(tmp_path, attention="kmip"), _toy_graph_data())
    metrics = trainer.fit(progress=False)
    for name in ("config.yaml", "last.pt", "best.pt", "log.csv", "curves.png", "metrics.json"):
        assert (tmp_path / name).is_file(), name
    assert json.loads((tmp_path / "metrics.json").read_text())["test"] == metrics["test"]
    assert len((tmp_path / "log.csv").read_text().strip().splitlines()) == 1 + 4
    tokens = torch.load(save_first_layer_tokens(trainer))
    n = trainer.data.splits["test"][0].num_nodes
    assert tokens["query"].shape == tokens["key"].shape == (n, 4, 4)
    assert tokens["dataset"] == "toy" and tokens["layer"] == 0
    x = trainer.model.node_encoder(trainer.data.splits["test"][0].x)
    torch.testing.assert_close(tokens["key"], trainer.model.layers[0].attention.lin_key(x).view(n, 4, 4))


def _toy_road_graph(num_nodes=60, seed=0) -> Data:
    """A node-level graph shaped like ``kmipgt.data.minnesota()`` (edge_length, masks), tiny."""
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, 3 * num_nodes), generator=gen)
    order = torch.randperm(num_nodes, generator=gen)
    masks = [torch.zeros(num_nodes, dtype=torch.bool) for _ in range(3)]
    for mask, part in zip(masks, order.tensor_split(3), strict=True):
        mask[part] = True
    return Data(x=torch.randn(num_nodes, 4, generator=gen), edge_index=edge_index,
                edge_length=100 * torch.rand(edge_index.size(1), generator=gen, dtype=torch.float64),
                y=torch.randint(0, 3, (num_nodes,), generator=gen),
                train_mask=masks[0], val_mask=masks[1], test_mask=masks[2])


def test_cli_trains_and_evaluates_a_node_level_graph(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: _toy_road_graph())
    out = tmp_path / "run"
    main(["train", "--no-progress", "--save-tokens", "--set", f"out_dir={out}", "--set", "optim.epochs=3",
          "--set", "model.num_layers=1", "--set", "model.channels=16", "--set", "model.attention.k=4",
          "--set", "data.rwse_dim=4", "--set", "data.lappe_dim=3",
          "--set", "model.encoder.coord_columns=[0,1]", "--set", "model.encoder.num_frequencies=2"])
    printed = capsys.readouterr().out
    assert "test accuracy:" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= metrics["test"] <= 1.0
    assert torch.load(out / "tokens.pt")["query"].shape == (60, 4, 4)
    main(["eval", str(out)])
    evaluated = json.loads(capsys.readouterr().out)
    assert np.isclose(evaluated["test"], metrics["test"])

    # The trained model applied to a larger graph of the same kind, saving that graph's tokens elsewhere.
    monkeypatch.setattr("kmipgt.train.datasets.load_raw",
                        lambda config: _toy_road_graph(config.data.options["num_nodes"], seed=1))
    bigger = tmp_path / "bigger"
    bigger.mkdir()
    main(["eval", str(out), "--tokens-out", str(bigger / "tokens.pt"),
          "--set", "data.options={num_nodes: 90}"])
    evaluated = json.loads(capsys.readouterr().out)
    assert evaluated["tokens"] == str(bigger / "tokens.pt")
    assert torch.load(bigger / "tokens.pt")["key"].shape == (90, 4, 4)
    assert not (out / "config.yaml").read_text().count("num_nodes")  # the run's own config is untouched


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[2].joinpath("configs").glob("*.yaml")),
                         ids=lambda p: p.stem)
def test_shipped_configs_load_and_build(path):
    config = load_config(path)
    assert config.data.name in list_datasets()
    data = PreparedData(config.task.level, None, None, in_channels=40, edge_channels=1, out_channels=10,
                        name=config.data.name)
    build_model(config, data)


def test_out_of_memory_is_an_error_with_a_hint(tmp_path, monkeypatch):
    trainer = Trainer(_toy_config(tmp_path, attention="kmip"), _toy_graph_data())

    def exhausted(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(trainer.model, "forward", exhausted)
    with pytest.raises(MemoryError, match=r"smaller model\.attention\.k") as info:
        trainer.fit(progress=False)
    assert isinstance(info.value.__cause__, torch.OutOfMemoryError)


def _toy_community_graph(num_nodes=120, seed=0) -> Data:
    """Four dense communities with sparse links between them: edges are predictable from the features."""
    gen = torch.Generator().manual_seed(seed)
    community = torch.arange(num_nodes) % 4
    pairs = torch.randint(0, num_nodes, (2, 8 * num_nodes), generator=gen)
    same = community[pairs[0]] == community[pairs[1]]
    keep = (same | (torch.rand(pairs.size(1), generator=gen) < 0.05)) & (pairs[0] != pairs[1])
    edge_index = to_undirected(pairs[:, keep], num_nodes=num_nodes)
    x = torch.nn.functional.one_hot(community, 4).float() + 0.3 * torch.randn(num_nodes, 4, generator=gen)
    return Data(x=x, edge_index=edge_index, y=community)


def _link_config(out_dir, epochs=40):
    return load_config(None, [
        f"out_dir={out_dir}", "task.level=edge", "task.loss=bce", "task.metric=roc_auc", "device=cpu",
        f"optim.epochs={epochs}", "optim.warmup_epochs=2", "optim.lr=0.01", "model.channels=16",
        "model.num_layers=1", "model.attention.k=4", "data.rwse_dim=4",
    ])


def test_link_splits_hold_out_edges_and_pair_them_with_non_edges(tmp_path, monkeypatch):
    graph = _toy_community_graph()
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: graph)
    data = Trainer(_link_config(tmp_path)).data
    existing = {tuple(e) for e in graph.edge_index.t().tolist()}
    train_edges = {tuple(e) for e in data.splits["train"][0].edge_index.t().tolist()}
    for split in ("val", "test"):
        part = data.splits[split][0]
        pairs = [tuple(e) for e in part.edge_label_index.t().tolist()]
        labels = part.edge_label.tolist()
        assert sum(labels) == len(labels) / 2  # one negative per positive
        for pair, label in zip(pairs, labels, strict=True):
            assert (pair in existing) == bool(label)
            assert pair not in train_edges  # held-out edges are not message-passing edges
        assert part.rwse.shape == (graph.num_nodes, 4)


def test_edge_level_task_trains_through_the_trainer(tmp_path, monkeypatch):
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: _toy_community_graph())
    trainer = Trainer(_link_config(tmp_path))
    metrics = trainer.fit(progress=False)
    losses = [row["train_loss"] for row in trainer.state.history]
    assert losses[-1] < 0.8 * losses[0]
    assert metrics["test"] > 0.75  # ROC-AUC of held-out edges against non-edges; chance is 0.5

    resumed_dir = tmp_path / "resumed"
    Trainer(_link_config(resumed_dir, epochs=40)).fit(stop_after=15, progress=False)
    resumed = Trainer(_link_config(resumed_dir, epochs=40))
    resumed.resume()
    assert resumed.fit(progress=False)["test"] == metrics["test"]  # fresh negatives replay exactly


def _community_node_data() -> PreparedData:
    """Node classification on :func:`_toy_community_graph` (the community is the label), random split."""
    graph = _toy_community_graph()
    order = torch.randperm(graph.num_nodes, generator=torch.Generator().manual_seed(0))
    for name, part in zip(("train_mask", "val_mask", "test_mask"), order.tensor_split(3), strict=True):
        graph[name] = torch.zeros(graph.num_nodes, dtype=torch.bool).index_fill_(0, part, True)
    return PreparedData("node", graph, None, in_channels=4, edge_channels=0, out_channels=4, name="toy")


@pytest.mark.parametrize("kind", BASELINE_KINDS)
def test_every_baseline_kind_learns_through_the_trainer(tmp_path, kind):
    config = load_config(None, [
        f"out_dir={tmp_path}", f"model.kind={kind}", "model.channels=16", "model.num_layers=2", "device=cpu",
        "optim.epochs=30", "optim.warmup_epochs=1", "optim.lr=0.01",
    ])
    trainer = Trainer(config, _community_node_data())
    assert isinstance(trainer.model, BaselineModel) and trainer.model.kind == kind
    metrics = trainer.fit(progress=False)
    losses = [row["train_loss"] for row in trainer.state.history]
    assert losses[-1] < 0.7 * losses[0]
    assert metrics["complete"] and metrics["parameters"] == sum(p.numel() for p in trainer.model.parameters())


@pytest.mark.parametrize("kind", BASELINE_KINDS)
def test_baselines_on_graph_and_edge_tasks(tmp_path, monkeypatch, kind):
    graph_config = _toy_config(tmp_path / "graph")
    graph_config.model.kind = kind
    if kind in ("sgformer", "polynormer"):
        with pytest.raises(ValueError, match=rf"'{kind}' baseline does not support task='graph'"):
            Trainer(graph_config, _toy_graph_data())
    else:
        assert Trainer(graph_config, _toy_graph_data()).fit(progress=False)["complete"]
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: _toy_community_graph())
    link_config = _link_config(tmp_path / "edge", epochs=3)
    link_config.model.kind = kind
    trainer = Trainer(link_config)
    assert trainer.fit(progress=False)["complete"]
    part = trainer.data.splits["test"][0]
    assert _forward(trainer.model, part).shape == (part.edge_label_index.size(1), 1)


def test_cli_trains_a_baseline_and_names_the_keys_it_ignores(tmp_path, capsys, caplog, monkeypatch):
    monkeypatch.setattr("kmipgt.train.datasets.load_raw", lambda config: _toy_road_graph())
    out = tmp_path / "run"
    defaults = Path(__file__).resolve().parents[1] / "defaults.yaml"
    main(["train", "--no-progress", "--config", str(defaults), "--set", f"out_dir={out}",
          "--set", "optim.epochs=2", "--set", "model.kind=gcn", "--set", "model.channels=16",
          "--set", "model.attention.k=4", "--set", "model.local=gine",
          "--set", "model.residual=true", "--set", "data.rwse_dim=4",
          "--set", "model.encoder.coord_columns=[0,1]", "--set", "model.encoder.num_frequencies=2"])
    assert "test accuracy:" in capsys.readouterr().out
    warnings = [r.getMessage() for r in caplog.records if "ignores" in r.getMessage()]
    assert warnings == ["model.kind=gcn ignores these model keys: local, attention.k"]
    saved = load_config(out / "config.yaml")
    assert saved.model.kind == "gcn" and saved.model.residual
    main(["eval", str(out)])
    evaluated = json.loads(capsys.readouterr().out)
    assert np.isclose(evaluated["test"], json.loads((out / "metrics.json").read_text())["test"])
    caplog.clear()
    build_model(load_config(None, ["model.residual=true"]), _community_node_data())  # GPS: residual unused
    assert [r.getMessage() for r in caplog.records] == ["model.kind=gps ignores these model keys: residual"]
    with pytest.raises(ValueError, match=r"model\.kind must be one of"):
        build_model(load_config(None, ["model.kind=gin"]), _community_node_data())


def test_config_saved_before_a_key_existed_matches_its_default():
    from kmipgt.train.config import config_differences, config_to_dict

    current = config_to_dict(load_config(None, ["model.attention.k=8"]))
    older = config_to_dict(load_config(None, ["model.attention.k=8"]))
    del older["task"]["label_inputs"], older["optim"]["precision"]
    assert config_differences(older, current) == []
    changed = config_to_dict(load_config(None, ["model.attention.k=8", "task.label_inputs=0.5"]))
    assert config_differences(older, changed) == ["task.label_inputs"]


def test_saved_tokens_of_position_keyed_attention_come_from_the_encodings(tmp_path):
    from kmipgt.analysis.tokens import collect_tokens

    config = _toy_config(tmp_path, attention="kmip")
    config.model.encoder.coord_columns, config.model.encoder.num_frequencies = [0, 1], 2
    config.model.encoder.attention_qk = "position"
    trainer = Trainer(config, _toy_graph_data())
    tokens = torch.load(save_first_layer_tokens(trainer))
    first = collect_tokens(trainer.model, trainer.data.splits["test"][0])[0]
    torch.testing.assert_close(tokens["query"], first.query)
    torch.testing.assert_close(tokens["key"], first.key)


def _recorded_losses(monkeypatch, bad_call: int | None = None, bad: float = 1.0) -> list[tuple[float, int]]:
    """Record every training step's loss and target count; the loss of call ``bad_call`` (from 0) times
    ``bad``."""
    losses, compute_loss = [], stepper.compute_loss

    def recording(name, output, target):
        loss = compute_loss(name, output, target)
        if len(losses) == bad_call:
            loss = loss * bad
        losses.append((float(loss.detach()), target.size(0)))
        return loss

    monkeypatch.setattr(stepper, "compute_loss", recording)
    return losses


def test_the_epoch_loss_is_the_step_losses_weighted_by_their_targets(tmp_path, monkeypatch):
    losses = _recorded_losses(monkeypatch)
    trainer = Trainer(_toy_config(tmp_path, attention="none"), _toy_graph_data())  # batches of 5, 5, 5, 1
    epoch_loss = trainer._train_epoch()
    assert [count for _, count in losses] == [5, 5, 5, 1]
    expected = sum(loss * count for loss, count in losses) / 16
    assert epoch_loss == pytest.approx(expected, rel=1e-6)
    assert epoch_loss != pytest.approx(np.mean([loss for loss, _ in losses]), rel=1e-3)


@pytest.mark.parametrize(("bad", "word"), [(float("nan"), "NaN"), (float("inf"), "inf")])
def test_a_non_finite_loss_stops_training_and_names_the_epoch(tmp_path, monkeypatch, bad, word):
    _recorded_losses(monkeypatch, bad_call=7, bad=bad)  # the last step of epoch 2
    trainer = Trainer(_toy_config(tmp_path, attention="none"), _toy_graph_data())
    with pytest.raises(FloatingPointError, match=rf"loss became {word} in epoch 2, .*last\.pt keeps epoch 1"):
        trainer.fit(progress=False)
    assert load_checkpoint(tmp_path / "last.pt", keys=("state",))["state"]["epoch"] == 1
