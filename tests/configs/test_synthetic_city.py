"""configs/synthetic_city.yaml ships the attention study's best-validation model, and that model trains."""

from torch_geometric.nn import GATConv

from kmipgt.sweep import cell_overrides, expand, load_sweep
from kmipgt.train import Trainer, load_config
from kmipgt.train.config import config_differences, config_to_dict


def test_the_shipped_recipe_is_the_study_cell_it_was_selected_from():
    sweep = load_sweep("sweeps/city_deep_confirm")
    cell = next(c for c in expand(sweep) if c.values == {"variant": "series", "seed": 0})
    selected = config_to_dict(load_config(sweep.base, cell_overrides(sweep, cell)))
    shipped = config_to_dict(load_config("synthetic_city"))
    assert set(config_differences(selected, shipped)) == {"threads", "out_dir"}


def test_gat_layers_with_the_gated_branch_in_series_in_the_last_two(tmp_path):
    config = load_config("synthetic_city", [
        "data.options={num_nodes: 400, seed: 0}", "model.channels=16", "model.dropout=0.0", "optim.epochs=40",
        "optim.warmup_epochs=1", "optim.lr=0.01", "optim.eval_every=5", "threads=1", "device=cpu",
        f"out_dir={tmp_path}",
    ])
    trainer = Trainer(config)
    layers = trainer.model.layers
    assert all(isinstance(layer.local, GATConv) for layer in layers)
    assert not any(layer.ffn or layer.branch_residual for layer in layers)
    with_attention = [i for i, layer in enumerate(layers) if layer.attention is not None]
    assert with_attention == [6, 7]
    assert all(
        layers[i].attention_order == "series" and layers[i].attention_gate is not None for i in with_attention
    )
    metrics = trainer.fit(progress=False)
    losses = [row["train_loss"] for row in trainer.state.history]
    assert metrics["complete"] and losses[-1] < 0.8 * losses[0]
