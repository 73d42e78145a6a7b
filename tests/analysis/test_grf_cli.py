"""`kmipgt analysis grf` on a trained GRF run: the modulation figure and table, the estimator check."""

import json
from pathlib import Path

import pytest
import torch.nn.functional as F

from kmipgt.cli import main
from kmipgt.train import load_run
from tiny_runs import train_tiny_city


def _trained_run(tmp_path, capsys, monkeypatch, attention: str, num_nodes: int) -> Path:
    monkeypatch.chdir(Path(__file__).parents[2])
    run = tmp_path / "run"
    train_tiny_city(run, attention=attention, num_nodes=num_nodes)
    capsys.readouterr()
    return run


@pytest.mark.slow
def test_cli_reads_the_learned_modulation_and_checks_the_estimator(tmp_path, capsys, monkeypatch):
    run = _trained_run(tmp_path, capsys, monkeypatch, "grf", 300)
    out = tmp_path / "grf"
    code = main(["analysis", "grf", str(run), "--walks", "2,200", "--seeds", "2", "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert (out / "grf_modulation.png").read_bytes()[:4] == b"\x89PNG"
    record = json.loads((out / "grf.json").read_text())
    cores = [module for name, module in load_run(run).model.named_modules() if name.endswith("core")]
    learned = record["modulation"][str(run)]
    assert [entry["layer"] for entry in learned] == ["layer 0", "layer 1"]
    for entry, core in zip(learned, cores, strict=True):
        assert entry["learned"] == F.softplus(core.theta).tolist()
    assert record["graph"] == {"split": "test", "index": 0, "num_nodes": 300}
    # 2 walk counts x 2 seeds x (2 layers x 4 heads)
    assert len(record["estimator"]) == 32
    assert {(row["layer"], row["head"]) for row in record["estimator"]} == {
        (layer, head) for layer in ("layer 0", "layer 1") for head in range(4)
    }
    few, many = record["summary"]
    assert (few["num_walks"], many["num_walks"]) == (2, 200)
    assert many["features_error"] < few["features_error"] and many["mask_error"] < few["mask_error"]
    assert "| layer 1 |" in printed.out and "| 200 |" in printed.out
    figure = tmp_path / "figures" / "f.png"
    code = main(["analysis", "grf", str(run), "--modulation-only", "--out", str(tmp_path / "only"),
                 "--figure", str(figure)])
    assert code == 0 and figure.read_bytes()[:4] == b"\x89PNG"
    assert not (tmp_path / "only" / "grf_modulation.png").exists()
    only = json.loads((tmp_path / "only" / "grf.json").read_text())
    assert only["estimator"] == [] and "summary" not in only and only["modulation"] == record["modulation"]


@pytest.mark.slow
def test_cli_refuses_a_run_without_grf_attention(tmp_path, capsys, monkeypatch):
    run = _trained_run(tmp_path, capsys, monkeypatch, "none", 100)
    code = main(["analysis", "grf", str(run), "--modulation-only", "--out", str(tmp_path / "grf")])
    assert code == 2 and "no GRF attention layer" in capsys.readouterr().err
    assert not (tmp_path / "grf" / "grf.json").exists()
