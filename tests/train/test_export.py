"""``kmipgt export``: a trained model as a torch.export program that runs, after ``torch.export.load``, on
graphs and batches of sizes it was not traced with, with the outputs of the eager model."""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Batch

from kmipgt.cli import main
from kmipgt.nn import KMIPAttention
from kmipgt.ops.ragged import batch_layout
from kmipgt.train import Trainer, load_config, load_run
from kmipgt.train.batches import batch_to_device, model_inputs
from kmipgt.train.datasets import PreparedData
from kmipgt.train.export import export_model
from tiny_runs import sign_graphs


def _graph_level_run(tmp_path) -> Trainer:
    graphs = sign_graphs(30, 0, edge_dim=2)
    splits = {"train": graphs[:18], "val": graphs[18:24], "test": graphs[24:]}
    data = PreparedData("graph", None, splits, in_channels=4, edge_channels=2, out_channels=2, name="toy")
    config = load_config(None, [
        f"out_dir={tmp_path}", "task.level=graph", "data.batch_size=5", "model.channels=8",
        "model.num_layers=2", "model.local=gatedgcn", "model.attention=kmip", "model.attention.k=3",
        "optim.epochs=1",
        "optim.warmup_epochs=0", "device=cpu", "threads=1",
    ])
    trainer = Trainer(config, data)
    trainer.fit(progress=False)
    return trainer


def _present(inputs: dict) -> dict:
    return {name: value for name, value in inputs.items() if value is not None}


def _saved_and_loaded(program, path):
    torch.export.save(program, path)
    return torch.export.load(path).module()


def test_an_exported_graph_model_runs_on_batches_it_was_not_traced_with(tmp_path):
    trainer = _graph_level_run(tmp_path / "run")
    model = trainer.model.eval()
    traced = next(iter(trainer.task.eval_batches("val")))  # 5 graphs
    inputs = _present(model_inputs(batch_to_device(traced, torch.device("cpu"))))
    program = _saved_and_loaded(export_model(model, inputs), tmp_path / "model.pt2")
    graphs = trainer.data.splits["test"] + trainer.data.splits["val"]
    # Other node, edge and graph counts, down to a single graph.
    for batch in (Batch.from_data_list(graphs[:3]), Batch.from_data_list(graphs),
                  Batch.from_data_list(graphs[:1])):
        inputs = _present(model_inputs(batch_to_device(batch, torch.device("cpu"))))
        torch.testing.assert_close(program(**inputs), model(**inputs))


def test_kmipgt_export_writes_a_program_that_scores_as_eval_does(tmp_path, capsys):
    """Point-cloud segmentation: batches of shapes, a label per point. The run's own test split, through
    the loaded program, scores what ``kmipgt eval`` scores."""
    run = tmp_path / "run"
    options = [f"out_dir={run}", "optim.epochs=1", "threads=1", "data.options.num_shapes=12",
               "data.options.num_points=64", "model.num_layers=2", "model.channels=16", "data.batch_size=3"]
    assert main(["train", "--no-progress", "--config", "synthetic_parts",
                 *(arg for option in options for arg in ("--set", option))]) == 0
    capsys.readouterr()
    assert main(["export", str(run)]) == 0
    assert "model.pt2" in capsys.readouterr().out
    trainer = load_run(run)
    program = torch.export.load(run / "model.pt2").module()
    metric = trainer.config.task.metric
    scores = dict(trainer.task.split_scores(
        lambda batch: program(**_present(model_inputs(batch))), [metric], ["test"], trainer.device
    ))
    assert scores["test"][metric] == pytest.approx(trainer.evaluate(("test",))["test"], abs=1e-6)


def test_an_exported_node_model_runs_on_a_graph_of_another_size(tmp_path):
    run = tmp_path / "run"
    options = ["--set", f"out_dir={run}", "--set", "optim.epochs=1", "--set", "threads=1"]
    assert main(["train", "--no-progress", "--config", "synthetic_city", *options,
                 "--set", "data.options.num_nodes=400"]) == 0
    assert main(["export", str(run)]) == 0
    other = load_run(run, overrides=["data.options.num_nodes=550", "data.options.seed=7"])
    inputs = _present(model_inputs(other.task.token_graph()))
    assert inputs["x"].shape[0] != 400
    program = torch.export.load(run / "model.pt2").module()
    torch.testing.assert_close(program(**inputs), other.model.eval()(**inputs))


def test_an_exported_attention_module_takes_any_node_count():
    torch.manual_seed(0)
    attention = KMIPAttention(16, heads=2, k=4).eval()

    class WithOffsets(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = attention

        def forward(self, x, batch, ptr):
            return self.attention(x, batch=batch, layout=batch_layout(x.shape[0], x.device, ptr=ptr))

    def inputs(sizes):
        ptr = torch.tensor([0, *sizes]).cumsum(0)
        batch = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes))
        return {"x": torch.randn(int(ptr[-1]), 16), "batch": batch, "ptr": ptr}

    program = export_model(WithOffsets(), inputs([6, 9, 4])).module()
    for sizes in ([3], [12, 2, 7, 7], [30, 1]):
        example = inputs(sizes)
        torch.testing.assert_close(program(**example), WithOffsets()(**example))
