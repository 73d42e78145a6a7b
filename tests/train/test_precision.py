"""bf16 training: autocast forward, fp32 weights and loss; GRF attention falls back to fp32 under autocast."""

import pytest
import torch
from torch_geometric.utils import to_undirected

from kmipgt.nn import GRFAttention
from kmipgt.train import Trainer
from kmipgt.train.validation import validate_config
from tiny_runs import toy_node_config, toy_node_data


def test_bf16_run_trains_with_fp32_weights(tmp_path):
    config = toy_node_config(tmp_path, epochs=30)
    config.log_branches = False
    config.optim.precision = "bf16"
    config.optim.lr = 0.01
    trainer = Trainer(config, toy_node_data(num_nodes=120))
    trainer.model.eval()
    graph = trainer.data.graph
    reference = trainer.model(graph.x, graph.edge_index, edge_attr=graph.edge_attr)
    bf16 = trainer._predict(graph)
    assert bf16.dtype == torch.float32
    # bf16 keeps 8 bits of mantissa: outputs agree with the fp32 forward to a few percent of their scale
    assert (bf16 - reference).abs().max() < 0.05 * reference.abs().max()
    losses = [trainer._train_epoch() for _ in range(30)]
    assert losses[-1] < 0.7 * losses[0]
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())


def test_grf_attention_runs_in_fp32_under_autocast():
    gen = torch.Generator().manual_seed(0)
    edge_index = to_undirected(torch.randint(0, 50, (2, 150), generator=gen))
    x = torch.randn(50, 16, generator=gen)
    module = GRFAttention(16, heads=2)
    torch.manual_seed(3)
    expected = module(x, edge_index=edge_index)
    torch.manual_seed(3)  # the same random walks
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = module(x, edge_index=edge_index)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, expected)


def test_unknown_precision_is_rejected(tmp_path):
    config = toy_node_config(tmp_path)
    config.optim.precision = "fp8"
    with pytest.raises(ValueError, match=r"optim\.precision"):
        validate_config(config)
