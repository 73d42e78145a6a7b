"""The model's config in the sections of its parts, and what was written before them: configs, overrides,
sweeps and run folders with the flat model keys read as the sections, checkpoints evaluating unchanged."""

import inspect
import json
import logging
import shutil
from pathlib import Path

import pytest
import yaml

from kmipgt.cli import main
from kmipgt.nn import GPSLayer, GraphTransformer, NodeEncoder
from kmipgt.train import evaluate_run, load_config
from kmipgt.train.config import config_differences, config_to_dict
from kmipgt.train.config_upgrade import MOVED_KEYS

RUNS_BEFORE = Path(__file__).resolve().parents[1] / "fixtures" / "runs_before_sections"
# A model config in the flat form, and the same in sections.
FLAT = {
    "k": 8, "heads": 2, "head_dim": 4, "attn_dropout": 0.1, "attention_gate": True,
    "attention_drop_path": 0.2,
    "attention_order": "series", "attention_layers": [-1], "attention_options": {"key_dropout": 0.3},
    "coord_columns": [0, 1], "num_frequencies": 3, "pe_channels": 4, "rwse_norm": True,
    "attention_qk": "position", "attention": "kmip", "channels": 16,
}
SECTIONS = {
    "channels": 16,
    "attention": {"kind": "kmip", "k": 8, "heads": 2, "head_dim": 4, "dropout": 0.1, "gate": True,
                  "drop_path": 0.2, "order": "series", "layers": [-1], "options": {"key_dropout": 0.3}},
    "encoder": {"coord_columns": [0, 1], "num_frequencies": 3, "pe_channels": 4, "rwse_norm": True,
                "attention_qk": "position"},
}


def _write(path: Path, model: dict) -> Path:
    path.write_text(yaml.safe_dump({"model": model}))
    return path


def test_the_model_and_its_layers_take_at_most_twelve_arguments():
    for cls in (GraphTransformer, GPSLayer):
        assert len(inspect.signature(cls).parameters) <= 12, cls.__name__


def test_flat_model_keys_are_read_as_their_sections_with_one_line_naming_them(tmp_path, caplog):
    sections = load_config(_write(tmp_path / "sections.yaml", SECTIONS))
    with caplog.at_level(logging.WARNING, logger="kmipgt"):
        flat = load_config(_write(tmp_path / "flat.yaml", FLAT))
    assert flat == sections
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 1
    # Every old key named with its new one; model.attention as a name is a short form, not an old key.
    assert all(f"{old} -> {new}" in lines[0] for old, new in MOVED_KEYS.items())
    assert "model.attention ->" not in lines[0]


def test_flat_keys_in_overrides_land_in_their_sections(caplog):
    with caplog.at_level(logging.WARNING, logger="kmipgt"):
        config = load_config(None, ["model.k=5", "model.attention_options.backend=dense", "model.heads=2"])
    a = config.model.attention
    assert (a.k, a.options, a.heads) == (5, {"backend": "dense"}, 2)
    assert "model.k -> model.attention.k" in caplog.text
    # The short form sets the kind and keeps the section's other keys.
    config = load_config(None, ["model.attention.k=7", "model.attention=none"])
    assert (config.model.attention.kind, config.model.attention.k) == ("none", 7)


def test_a_key_set_under_its_old_and_new_name_is_refused(tmp_path):
    path = _write(tmp_path / "both.yaml", {"k": 4, "attention": {"k": 8}})
    with pytest.raises(ValueError, match=r"'model\.k' and 'model\.attention\.k'"):
        load_config(path)


def test_a_saved_flat_config_has_no_differences_from_its_sections():
    saved = yaml.safe_load((RUNS_BEFORE / "city" / "config.yaml").read_text())
    assert "k" in saved["model"]  # written before the sections
    current = config_to_dict(load_config(RUNS_BEFORE / "city" / "config.yaml"))
    assert config_differences(saved, current) == []
    current["model"]["attention"]["k"] += 1
    assert config_differences(saved, current) == ["model.attention.k"]


def test_a_node_encoder_built_apart_is_the_models_own():
    encoder = NodeEncoder(5, 16, coord_columns=[0, 1], num_frequencies=2, attention_qk="position")
    model = GraphTransformer(5, 16, 3, num_layers=1, encoder=encoder, attn_kwargs={"k": 2})
    assert model.node_encoder is encoder and model.layers[0].attention.qk_channels == 8
    with pytest.raises(ValueError, match="the model needs 6 -> 16"):
        GraphTransformer(6, 16, 3, encoder=encoder)
    with pytest.raises(TypeError, match="coord_colums"):
        GraphTransformer(5, 16, 3, encoder={"coord_colums": [0]})


@pytest.mark.parametrize("run", ["city", "minnesota", "gcn"])
def test_a_run_written_before_the_sections_evaluates_to_its_metrics(run, tmp_path):
    """Runs trained and saved by kmipgt before the model's keys had sections (a gated series k-MIP model
    keyed by position, a pre-norm one with LapPE, RWSE, a narrower head and core options, a GCN
    baseline): their checkpoints load into the model their flat config builds, with the same scores."""
    run_dir = shutil.copytree(RUNS_BEFORE / run, tmp_path / run)
    saved = json.loads((run_dir / "metrics.json").read_text())
    metrics = evaluate_run(run_dir)
    for split in ("train", "val", "test"):
        assert metrics[split] == pytest.approx(saved[split], abs=1e-6), split


def test_configs_show_prints_a_config_whole_in_sections(capsys):
    assert main(["configs", "--show", "synthetic_city"]) == 0
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown == config_to_dict(load_config("synthetic_city"))
    assert shown["model"]["attention"]["layers"] == [-2, -1] and "k" not in shown["model"]
