"""The widths a model was built for, read back from its weights alone, for every model kind and level."""

import pytest

from kmipgt.train import build_model, load_config
from kmipgt.train.choices import MODEL_KINDS
from kmipgt.train.datasets import PreparedData
from kmipgt.train.widths import trained_widths


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("level", ["node", "graph", "edge"])
def test_the_widths_a_model_was_built_for_are_read_from_its_weights(kind, level):
    if level == "graph" and kind in ("sgformer", "polynormer"):
        pytest.skip("these baselines refuse graph-level tasks (docs/training.md, Baselines)")
    config = load_config("minnesota", [f"model.kind={kind}", f"task.level={level}", "model.channels=16"])
    for in_channels, edge_channels, out_channels in ((7, 0, 5), (3, 2, 1), (40, 9, 12)):
        data = PreparedData(level, None, None, in_channels, edge_channels, out_channels, "built")
        widths = trained_widths(config, level, build_model(config, data).state_dict())
        # The PyG baselines read no edge features: no weight depends on their width.
        edges = edge_channels if kind == "gps" else None
        assert widths == {"in_channels": in_channels, "edge_channels": edges, "out_channels": out_channels}

