"""``optim.compile``: the model through torch.compile, and the error when that fails."""

import pytest
import torch

from kmipgt.train import Trainer, load_config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.runtime import compile_failure_hint
from kmipgt.train.validation import validate_config
from tiny_runs import sign_graphs


def _data() -> PreparedData:
    graphs = sign_graphs(24, 0, edge_dim=2)
    splits = {"train": graphs[:16], "val": graphs[16:20], "test": graphs[20:]}
    return PreparedData("graph", None, splits, in_channels=4, edge_channels=2, out_channels=2, name="toy")


@pytest.mark.slow
def test_a_compiled_run_compiles_once_and_trains_as_eager(tmp_path):
    """Two epochs of GatedGCN + k-MIP on batches of 4 graphs of 3 to 8 nodes (every batch another shape):
    one graph for training and one for evaluation, and the losses and scores of the eager run."""
    histories = []
    for compiled in ("false", "true"):
        config = load_config(None, [
            f"out_dir={tmp_path / compiled}", "task.level=graph", "data.batch_size=4", "model.channels=8",
            "model.num_layers=1", "model.local=gatedgcn", "model.attention=kmip", "model.attention.k=3",
            "optim.epochs=2", "optim.warmup_epochs=1", "device=cpu", "threads=1", f"optim.compile={compiled}",
        ])
        trainer = Trainer(config, _data())
        trainer.fit(progress=False)
        histories.append(trainer.state.history)
    eager, compiled = histories
    assert [row["compiled_graphs"] for row in compiled] == [2, 2]
    for row, expected in zip(compiled, eager, strict=True):
        for key in ("train_loss", "val", "test"):
            assert row[key] == pytest.approx(expected[key], rel=1e-4, abs=1e-6)


def test_a_failure_to_compile_names_the_option():
    failure = r"torch\.compile failed .*optim\.compile: false"
    with pytest.raises(RuntimeError, match=failure) as caught, compile_failure_hint(True):
        raise torch._dynamo.exc.Unsupported("a graph break it cannot take")
    assert isinstance(caught.value.__cause__, torch._dynamo.exc.Unsupported)
    with pytest.raises(RuntimeError, match=r"AssertionError: internal check"), compile_failure_hint(True):
        raise AssertionError("internal check")
    # The model's own errors, and everything uncompiled, pass unchanged.
    with pytest.raises(ValueError, match="bad input"), compile_failure_hint(True):
        raise ValueError("bad input")
    with pytest.raises(AssertionError), compile_failure_hint(False):
        raise AssertionError("internal check")


def test_compile_is_for_one_process():
    config = load_config(None, ["optim.compile=true", "task.level=graph", "distributed.strategy=ddp"])
    with pytest.raises(ValueError, match=r"'optim\.compile' needs distributed\.strategy 'none'"):
        validate_config(config)
