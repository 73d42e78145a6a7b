"""Branch logging: each GPS layer's branch output scale and gradient norm, recorded during training."""

import csv

import pytest
import torch

from kmipgt.nn.gps_layer import GPSLayer
from kmipgt.train import Trainer
from tiny_runs import toy_node_config, toy_node_data


def _reference_outputs(model):
    """Our own hooks: the raw (input, output) of every layer's local and attention module."""
    captured, handles = {}, []
    layers = [m for m in model.modules() if isinstance(m, GPSLayer)]
    for index, layer in enumerate(layers):
        for branch, module in (("local", layer.local), ("attn", layer.attention)):
            def hook(module, args, output, key=f"L{index}_{branch}"):
                output = output[0] if isinstance(output, tuple) else output
                captured[key] = (args[0].detach(), output.detach())
            handles.append(module.register_forward_hook(hook))
    return layers, captured, handles


@pytest.mark.parametrize("local", ["gatedgcn", "sage"])
def test_branch_statistics_match_direct_computation(tmp_path, local):
    trainer = Trainer(toy_node_config(tmp_path, local), toy_node_data())
    layers, captured, handles = _reference_outputs(trainer.model)
    trainer._train_epoch()
    row = trainer.branches.epoch_row()
    for index, layer in enumerate(layers):
        x, out = captured[f"L{index}_local"]
        update = out - x if local == "gatedgcn" else out  # GatedGCN returns x + update
        assert row[f"L{index}_local_out"] == pytest.approx(float(update.pow(2).mean().sqrt()), rel=1e-5)
        _, attn = captured[f"L{index}_attn"]
        assert row[f"L{index}_attn_out"] == pytest.approx(float(attn.pow(2).mean().sqrt()), rel=1e-5)
        for branch, module in (("local", layer.local), ("attn", layer.attention)):
            grads = [p.grad.flatten() for p in module.parameters() if p.grad is not None]
            expected = float(torch.linalg.vector_norm(torch.cat(grads)))
            assert expected > 0 and row[f"L{index}_{branch}_grad"] == pytest.approx(expected, rel=1e-5)
    assert trainer.branches.epoch_row() == {}  # reset after reading
    for handle in handles:
        handle.remove()


def test_evaluation_passes_are_not_recorded(tmp_path):
    trainer = Trainer(toy_node_config(tmp_path), toy_node_data())
    trainer.evaluate()
    assert trainer.branches.epoch_row() == {}


def test_training_writes_branch_columns_and_plot(tmp_path):
    Trainer(toy_node_config(tmp_path, epochs=3), toy_node_data()).fit(progress=False)
    with open(tmp_path / "log.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    expected = {f"L{i}_{b}_{w}" for i in (0, 1) for b in ("local", "attn") for w in ("out", "grad")}
    assert expected <= set(rows[0])
    assert all(float(row[key]) > 0 for row in rows for key in expected)
    assert (tmp_path / "branches.png").stat().st_size > 0


def test_branches_off_by_default(tmp_path):
    config = toy_node_config(tmp_path, epochs=1)
    config.log_branches = False
    trainer = Trainer(config, toy_node_data())
    trainer.fit(progress=False)
    assert trainer.branches is None and not (tmp_path / "branches.png").exists()
    with open(tmp_path / "log.csv") as f:
        assert not any(key.startswith("L0_") for key in next(csv.DictReader(f)))


def test_checkpointing_does_not_count_the_recomputed_forward(tmp_path):
    rows = []
    for checkpoint in (False, True):
        config = toy_node_config(tmp_path / str(checkpoint))
        config.model.checkpoint = checkpoint
        trainer = Trainer(config, toy_node_data())
        trainer._train_epoch()
        rows.append(trainer.branches.epoch_row())
    assert rows[0].keys() == rows[1].keys()
    for key in rows[0]:
        assert rows[1][key] == pytest.approx(rows[0][key], rel=1e-4), key
