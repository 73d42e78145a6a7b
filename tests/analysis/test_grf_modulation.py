"""The learned modulation functions read from a model with GRF attention, and their figure."""

import math

import pytest
import torch
import torch.nn.functional as F

from kmipgt.analysis.modulation import Modulation, modulations, plot_modulations
from kmipgt.nn import GraphTransformer


def _grf_model(**options) -> GraphTransformer:
    attn_kwargs = {"heads": 2, "layers": [0, 2], "max_len": 4, "f_decay": 0.3, **options}
    return GraphTransformer(5, 16, 3, num_layers=3, attention="grf", attn_kwargs=attn_kwargs)


def test_modulations_are_each_layers_softplus_of_theta_and_its_start():
    torch.manual_seed(0)
    model = _grf_model()
    initial = torch.tensor([math.exp(-0.3 * t) for t in range(5)])
    found = modulations(model)
    assert [m.name for m in found] == ["layer 0", "layer 2"]
    for m in found:
        assert m.learned.shape == (2, 5)
        torch.testing.assert_close(m.initial, initial)
        torch.testing.assert_close(m.learned, initial.expand(2, 5))  # untrained: every head at its start
    theta = torch.randn(2, 5)
    model.layers[2].attention.core.theta.data.copy_(theta)
    trained = modulations(model)[1]
    torch.testing.assert_close(trained.learned, F.softplus(theta))
    torch.testing.assert_close(trained.initial, initial)


def test_a_model_without_grf_attention_is_refused():
    with pytest.raises(ValueError, match="no GRF attention"):
        modulations(GraphTransformer(5, 16, 3, num_layers=1, attn_kwargs={"k": 4}))


def test_the_figure_is_written_and_mismatched_runs_are_refused(tmp_path):
    torch.manual_seed(0)
    first, second = modulations(_grf_model()), modulations(_grf_model())
    path = tmp_path / "f.png"
    plot_modulations(path, {"seed 0": first, "seed 1": second})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    other = [Modulation("layer 1", m.learned, m.initial) for m in second]
    with pytest.raises(ValueError, match="different GRF layers"):
        plot_modulations(tmp_path / "g.png", {"seed 0": first, "other": other})
    with pytest.raises(ValueError, match="empty"):
        plot_modulations(tmp_path / "h.png", {})
