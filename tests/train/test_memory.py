"""kmipgt bench memory: state, saved-for-backward bytes per component and RSS phases of one training step."""

import json

from kmipgt.cli import main
from kmipgt.train import load_config
from kmipgt.train.loop import Trainer
from kmipgt.train.memory import memory_breakdown

TINY = ["data.options={num_nodes: 300, seed: 0}", "model.num_layers=2", "model.channels=16", "threads=1"]


def _config(tmp_path, *overrides):
    return load_config("synthetic_city_graphgps", [*TINY, f"out_dir={tmp_path}", *overrides])


def _breakdown(tmp_path, *overrides):
    return memory_breakdown(_config(tmp_path, *overrides))


def test_plain_step_attributes_saved_bytes_to_the_layer_components(tmp_path):
    result = _breakdown(tmp_path)
    saved = result["saved_mib"]
    assert saved["local MPNN (GatedGCN)"] > 0 and saved["attention (projections, search, gathers)"] > 0
    assert "checkpointed layer inputs" not in saved
    model = Trainer(_config(tmp_path)).model
    params = sum(p.numel() for p in model.parameters()) * 4 / 2**20
    assert abs(result["state_mib"]["parameters"] - params) < 0.1
    assert abs(result["state_mib"]["optimizer moments"] - 2 * params) < 0.1  # AdamW: two moments
    assert set(result["rss_mib"]) == {
        "data and model", "training forward", "backward", "optimizer step", "evaluation forward",
    }


def test_sparse_saved_tensors_are_counted(tmp_path):
    # GRF attention saves sparse masks for backward; a strided-only count would fail on them.
    saved = _breakdown(tmp_path, "model.attention=grf", "model.attention.options={}")["saved_mib"]
    assert saved["attention (projections, search, gathers)"] > 0


def test_checkpointing_keeps_only_the_layer_inputs(tmp_path):
    result = _breakdown(tmp_path, "model.checkpoint=true")
    saved = result["saved_mib"]
    assert "local MPNN (GatedGCN)" not in saved and "norms" not in saved
    # Each of the 2 layers keeps h [N, 16] and e [E, 16] in fp32.
    expected = 2 * (result["nodes"] + result["edges"]) * 16 * 4 / 2**20
    assert abs(saved["checkpointed layer inputs"] - expected) < 0.1


def test_cli_writes_the_json(tmp_path, capsys):
    out = tmp_path / "memory.json"
    args = ["bench", "memory", "--config", "synthetic_city_graphgps", "--out", str(out)]
    for item in [*TINY, f"out_dir={tmp_path}"]:
        args += ["--set", item]
    assert main(args) == 0
    assert "local MPNN (GatedGCN)" in capsys.readouterr().out
    assert json.loads(out.read_text())["nodes"] == 300
