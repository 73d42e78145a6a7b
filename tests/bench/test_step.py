"""``kmipgt bench step`` (kmipgt.train.step_time): a training step's time split into data, attention, MPNN
and the rest."""

import json

import pytest
import torch
from torch_geometric.nn import GCNConv

from kmipgt.cli import main
from kmipgt.nn import BaselineModel, GraphTransformer
from kmipgt.train import load_config
from kmipgt.train.step_time import PARTS, step_breakdown, timed_modules

TINY = ["model.num_layers=2", "model.channels=8", "data.batch_size=3", "device=cpu", "threads=1"]


@pytest.fixture(autouse=True)
def _keep_thread_count():
    """The trainer sets torch's thread count for the run; later tests keep their own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _breakdown(*overrides: str) -> dict:
    return step_breakdown(load_config("peptides_func", [*TINY, *overrides]), steps=2, warmup=1)


def _check_sums(result: dict) -> None:
    assert set(result["parts_ms"]) == set(PARTS)
    assert all(ms >= 0 for ms in result["parts_ms"].values())
    assert result["total_ms"] == pytest.approx(sum(result["parts_ms"].values()))
    assert len(result["per_step"]) == 2
    for step in result["per_step"]:
        assert all(step[part] >= 0 for part in PARTS)
        assert step["total"] == pytest.approx(sum(step[part] for part in PARTS))
    assert result["step_ms"] == pytest.approx(sum(s["total"] for s in result["per_step"]) / 2)


def test_the_parts_add_up_and_attention_is_timed_only_where_there_is_some():
    result = _breakdown()
    _check_sums(result)
    assert result["parts_ms"]["attention"] > 0 and result["parts_ms"]["mpnn"] > 0
    assert result["batch"]["graphs"] == 3 and 300 <= result["batch"]["nodes"] <= 597
    assert result["device"] == "cpu" and result["torch"] == torch.__version__ and result["threads"] == 1
    assert result["modules_timed"]
    ablation = _breakdown("model.attention=none")
    _check_sums(ablation)
    assert ablation["parts_ms"]["attention"] == 0 and ablation["parts_ms"]["mpnn"] > 0
    assert ablation["parameters"] < result["parameters"]


def test_timed_modules_are_the_branches_of_gps_layers_or_a_baselines_convolutions():
    model = GraphTransformer(
        4, 8, 2, num_layers=3, local="gatedgcn", attention="kmip", attn_kwargs={"layers": [1], "k": 2},
    )
    parts = timed_modules(model)
    assert [part for part, _ in parts] == ["mpnn", "attention", "mpnn", "mpnn"]
    assert [module for part, module in parts if part == "attention"] == [model.layers[1].attention]
    baseline = BaselineModel("gcn", 4, 8, 2, num_layers=2)
    convs = timed_modules(baseline)
    assert len(convs) == 2 and all(part == "mpnn" and isinstance(m, GCNConv) for part, m in convs)


def test_bad_step_counts_are_errors():
    config = load_config("peptides_func", TINY)
    with pytest.raises(ValueError, match="steps must be an int >= 1"):
        step_breakdown(config, steps=0)
    with pytest.raises(ValueError, match="warmup must be an int >= 0"):
        step_breakdown(config, warmup=-1)


def test_cli_prints_the_table_and_writes_json_and_markdown(tmp_path, capsys):
    args = ["bench", "step", "--config", "peptides_func", "--steps", "2", "--warmup", "0"]
    args += ["--out", str(tmp_path)]
    for override in TINY[:3]:
        args += ["--set", override]
    assert main([*args, "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    result = json.loads((tmp_path / "step.json").read_text())
    assert result["config"] == "peptides_func" and result["overrides"] == TINY[:3]
    assert result["device"] == "cpu" and result["threads"] == 1
    table = (tmp_path / "step.md").read_text()
    assert table.startswith("| part | median ms | share |") and table.strip() in printed
    assert all(f"| {part} |" in table for part in PARTS)
