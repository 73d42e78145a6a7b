"""``kmipgt sweep --jobs auto``: the GPU's memory over the memory counted per cell, at most one cell per CPU
and per cell of the sweep; one at a time on the CPU."""

from types import SimpleNamespace

import pytest
import torch

from kmipgt.cli import main
from kmipgt.sweep import jobs
from kmipgt.sweep.jobs import CELL_GPU_GIB, auto_jobs


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA device of ``gpu.memory`` bytes (80 GiB) on a machine of 16 CPUs."""
    state = SimpleNamespace(memory=80 * 2**30, asked=[])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def properties(index):
        state.asked.append(index)
        return SimpleNamespace(total_memory=state.memory)

    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(jobs, "available_cpus", lambda: 16)
    return state


def test_a_gpu_takes_as_many_cells_as_its_memory_holds_one_per_cpu_at_most(gpu):
    assert CELL_GPU_GIB == 4.0
    assert auto_jobs(18, "auto") == 16  # 20 fit in 80 GiB, 16 CPUs
    assert auto_jobs(12, "cuda") == 12
    gpu.memory = 10 * 2**30
    assert auto_jobs(18, "cuda:1") == 2 and gpu.asked[-1] == 1
    gpu.memory = 2**30
    assert auto_jobs(18, "auto") == 1


def test_the_cpu_runs_one_cell_at_a_time(gpu, monkeypatch):
    assert auto_jobs(18, "cpu") == 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert auto_jobs(18, "auto") == 1


def test_jobs_takes_a_count_or_auto(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "sweeps/influence_of_k", "--jobs", "0"])
    assert "expected an integer >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["sweep", "sweeps/influence_of_k", "--jobs", "many"])
    assert "expected an integer >= 1, got 'many'" in capsys.readouterr().err
