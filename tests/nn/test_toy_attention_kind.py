"""A new attention kind is one core plus one registry entry: a toy kind registered here trains through the
CLI with ``--set model.attention=<kind>`` without any other file knowing of it."""

import json

import pytest
import torch
from torch import Tensor
from torch_geometric.utils import scatter

from kmipgt.cli import main
from kmipgt.nn import ATTENTION_KINDS, AttentionCore, AttentionKind, GPSLayer
from kmipgt.train.checkpoint import load_checkpoint

TOY = "toy_mean"


class MeanCore(AttentionCore):
    """Uniform attention: every query gets the mean of its graph's values."""

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor | None = None,
        batch: Tensor | None = None,
    ) -> Tensor:
        batch = torch.zeros(value.shape[0], dtype=torch.long) if batch is None else batch
        return scatter(value, batch, 0, reduce="mean")[batch]


@pytest.fixture
def toy_kind():
    ATTENTION_KINDS.register(AttentionKind(TOY, MeanCore))
    yield TOY
    ATTENTION_KINDS.remove(TOY)


def test_a_registered_kind_builds_in_a_gps_layer_and_attends_uniformly(toy_kind):
    torch.manual_seed(0)
    layer = GPSLayer(8, local="gcn", attention=toy_kind, attn_kwargs={"heads": 2}).eval()
    x, batch = torch.randn(7, 8), torch.tensor([0, 0, 0, 1, 1, 1, 1])
    value = layer.attention.lin_value(x)
    # Independent reference: a softmax over equal scores is the mean over the graph's keys.
    scores = torch.zeros(7, 7).masked_fill(batch[:, None] != batch[None, :], float("-inf"))
    expected = layer.attention.lin_out(torch.softmax(scores, dim=1) @ value)
    torch.testing.assert_close(layer.attention(x, batch=batch), expected)
    assert layer.attention.attn_type == toy_kind and isinstance(layer.attention.core, MeanCore)


def test_a_registered_kind_trains_through_the_cli(toy_kind, tmp_path):
    code = main([
        "train", "--no-progress",
        *("--set", f"out_dir={tmp_path}", "--set", f"model.attention={toy_kind}", "--set", "optim.epochs=1"),
        *("--set", "optim.warmup_epochs=0", "--set", "model.channels=8", "--set", "model.num_layers=1"),
        *("--set", "model.attention.heads=2", "--set", "device=cpu", "--set", "threads=1"),
    ])
    assert code == 0
    assert json.loads((tmp_path / "metrics.json").read_text())["complete"]
    state = load_checkpoint(tmp_path / "best.pt")["model"]
    assert "layers.0.attention.lin_query.weight" in state


def test_the_toy_kind_is_gone_after_its_test():
    assert TOY not in ATTENTION_KINDS
