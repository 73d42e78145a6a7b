"""``kmipgt bench compile`` (kmipgt.train.compile_time): a compiled training step against the eager one,
interleaved in one process."""

import json

import pytest
import torch

from kmipgt.cli import main
from kmipgt.train.compiled import CompiledModel

TINY = ["model.num_layers=2", "model.channels=8", "data.batch_size=3", "device=cpu"]


@pytest.fixture(autouse=True)
def _traced_without_code_generation(monkeypatch):
    """aot_eager traces forward and backward as inductor does, without its minute of code generation; the
    trainer's thread count is restored after."""
    defaults = CompiledModel.__init__.__defaults__
    monkeypatch.setattr(CompiledModel.__init__, "__defaults__", ("aot_eager", *defaults[1:]))
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_the_benchmark_times_both_steps_in_turns_and_counts_the_graphs(tmp_path, capsys):
    out = tmp_path / "compile"
    args = ["bench", "compile", "--config", "peptides_func", "--steps", "3", "--warmup", "1",
            "--out", str(out)]
    assert main([*args, *(arg for option in TINY for arg in ("--set", option))]) == 0
    result = json.loads((out / "compile.json").read_text())
    assert {len(result["steps"]["eager"]), len(result["steps"]["compiled"])} == {3}
    assert result["ratio"] == pytest.approx(result["compiled_ms"] / result["eager_ms"])
    assert result["compiled_graphs"] == 1  # the stand-in batches differ in shape: one dynamic graph
    assert (out / "compile.png").stat().st_size > 0
    assert "compiled / eager" in capsys.readouterr().out
