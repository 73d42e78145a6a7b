"""A streamed S3DIS copy trains on the same mini-batches as the copy held in memory."""

import json

import pytest
import torch

from kmipgt.cli import main
from kmipgt.data.streamed import StreamedGraphs
from kmipgt.train import load_config
from kmipgt.train.datasets import prepare_data
from kmipgt.train.tasks.levels import make_task
from point_cloud_copies import write_s3dis

pytestmark = pytest.mark.requires("h5py")


def _task(root, stream: bool, normalize: bool):
    config = load_config("s3dis", [
        f"data.options.root={root}", "data.options.k=8", "data.options.val_blocks=1",
        f"data.options.stream={stream}", "data.batch_size=2", f"data.normalize_features={normalize}",
    ])
    return make_task(config, prepare_data(config), torch.Generator().manual_seed(0))


def _batches(task) -> list:
    train = [step.batch for step in task.train_steps(torch.device("cpu"))]
    return train + [batch for split in ("val", "test") for batch in task.eval_batches(split)]


def test_streamed_batches_equal_the_held_ones_bit_for_bit(tmp_path):
    write_s3dis(tmp_path)
    held, streamed = _task(tmp_path, False, False), _task(tmp_path, True, False)
    assert isinstance(streamed.data.splits["train"], StreamedGraphs)
    assert streamed.steps_per_epoch() == held.steps_per_epoch() == 2
    assert streamed.data.out_channels == held.data.out_channels
    for a, b in zip(_batches(held), _batches(streamed), strict=True):
        assert set(a.keys()) == set(b.keys()) and a.keys()
        assert all(torch.equal(a[key], b[key]) for key in sorted(a.keys()))


def test_streamed_z_scores_use_the_training_blocks_moments(tmp_path):
    write_s3dis(tmp_path)
    raw = _task(tmp_path, False, False).data.splits
    x = torch.cat([graph.x for graph in raw["train"]]).double()
    mean, std = x.mean(0), x.std(0)
    streamed = _task(tmp_path, True, True)
    for split in ("train", "val", "test"):
        for graph, scored in zip(raw[split], streamed.data.splits[split], strict=True):
            torch.testing.assert_close(scored.x.double(), (graph.x.double() - mean) / std, rtol=0, atol=1e-5)
    held = _task(tmp_path, False, True)
    for a, b in zip(_batches(held), _batches(streamed), strict=True):
        torch.testing.assert_close(a.x, b.x, rtol=0, atol=1e-5)
        assert torch.equal(a.edge_index, b.edge_index) and torch.equal(a.y, b.y)


def test_a_streamed_copy_trains_an_epoch(tmp_path):
    write_s3dis(tmp_path / "copy")
    sets = [f"data.options.root={tmp_path / 'copy'}", "data.options.k=8", "data.options.val_blocks=1",
            "data.options.stream=true", "model.num_layers=2", "model.channels=16",
            "model.attention.head_dim=4",
            "threads=1", "device=cpu", "optim.epochs=1", "optim.warmup_epochs=0", "data.batch_size=4",
            f"out_dir={tmp_path / 'run'}"]
    args = ["train", "--no-progress", "--config", "s3dis", *[a for item in sets for a in ("--set", item)]]
    assert main(args) == 0
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["complete"] and metrics["metric"] == "miou"
    assert all(0.0 <= metrics[split] <= 1.0 for split in ("train", "val", "test"))
