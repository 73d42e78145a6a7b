"""``kmipgt bench ragged``: every method and pass is timed on one batch and written out."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from kmipgt.bench import ragged
from kmipgt.bench.ragged import RAGGED_METHODS, RaggedBenchConfig, markdown_table, run_ragged_benchmark


def test_every_method_and_pass_is_timed_against_the_padded_sdpa_call(tmp_path):
    config = RaggedBenchConfig(graphs=6, min_nodes=3, max_nodes=12, heads=2, dim=4, k=3, repeats=2, warmup=1)
    result = run_ragged_benchmark(config, tmp_path)
    records = {(r["method"], r["pass"]): r for r in result["records"]}
    assert set(records) == {(m, p) for m in RAGGED_METHODS for p in ("forward", "forward+backward")}
    for record in records.values():
        assert len(record["times"]) == 2 and record["time_min"] <= record["time_median"] <= record["time_max"]
        bound = records["sdpa-padded", record["pass"]]["time_median"]
        assert record["vs_sdpa_padded"] == pytest.approx(record["time_median"] / bound)
        assert record["host_syncs"] is None  # counted on CUDA only
    assert result["batch"]["largest_graph"] <= 12
    assert json.loads((tmp_path / "ragged.json").read_text())["config"]["graphs"] == 6
    assert (tmp_path / "ragged.png").stat().st_size > 0
    assert markdown_table(result).count("\n") == 1 + len(records)


def test_a_batch_whose_sizes_are_upside_down_is_refused():
    with pytest.raises(ValueError, match="`max_nodes` \\(3\\) must be >= `min_nodes` \\(5\\)"):
        RaggedBenchConfig(min_nodes=5, max_nodes=3)


def test_the_command_line_takes_one_flag_per_config_field(tmp_path, capsys):
    from kmipgt.cli import main

    argv = ["bench", "ragged", "--graphs", "3", "--min-nodes", "2", "--max-nodes", "5", "--k", "2",
            "--repeats", "1", "--warmup", "0", "--out", str(tmp_path)]
    assert main(argv) == 0
    written = json.loads((tmp_path / "ragged.json").read_text())
    assert written["config"]["graphs"] == 3 and written["config"]["k"] == 2
    assert "| kmip | forward |" in capsys.readouterr().out


def test_host_syncs_count_the_synchronizing_calls_not_the_prototype_notice(monkeypatch):
    # torch's first sync-debug-mode switch warns that the mode is a prototype: no sync of the call.
    def set_mode(mode):
        if mode == "warn":
            warnings.warn("Synchronization debug mode is a prototype feature", UserWarning, stacklevel=2)

    def call():
        warnings.warn(ragged.SYNC_WARNING, UserWarning, stacklevel=2)
        return torch.ones(3, requires_grad=True) * 2

    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", set_mode)
    assert ragged._host_syncs(call, torch.device("cuda")) == 1
