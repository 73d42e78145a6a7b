"""How the Triton kernels are launched, checked on the host with the kernels replaced by recorders: on the
inputs' device (its guard entered around every launch) and with compile-time constants that take a bounded
set of values. What the kernels compute is tested in the interpreter and on CUDA (test_triton_attention.py,
test_search_backends.py, test_cuda_search.py)."""

from __future__ import annotations

import contextlib

import pytest
import torch

pytest.importorskip("triton")

import kmipgt.ops.search.triton_kernel as triton_kernel
import kmipgt.ops.triton_attention as triton_attention
from kmipgt.ops.search.cuda_device import SM90_SHARED_MEMORY, device_guard
from kmipgt.ops.search.triton_plan import search_plan


class _Recorder:
    """Stands for a ``@triton.jit`` kernel: ``kernel[grid](*args, **constants)`` records the launch, and
    whether a device guard was entered around it."""

    def __init__(self, guard_state: dict):
        self.launches: list[dict] = []
        self.guard_state = guard_state

    def __getitem__(self, grid):
        def launch(*args, **constants):
            self.launches.append({"grid": grid, "args": args, "constants": constants,
                                  "guarded": self.guard_state["inside"]})

        return launch


@pytest.fixture
def recorded(monkeypatch):
    """The kernels of both launchers replaced by recorders, and their device guard by one that records the
    device it is entered for."""
    state = {"inside": False, "devices": []}

    @contextlib.contextmanager
    def guard(device):
        state["devices"].append(torch.device(device))
        state["inside"] = True
        try:
            yield
        finally:
            state["inside"] = False

    kernels = {}
    for module, names in ((triton_kernel, ("_topk_kernel",)),
                          (triton_attention, ("_forward_kernel", "_backward_kernel"))):
        monkeypatch.setattr(module, "device_guard", guard)
        for name in names:
            kernels[name] = _Recorder(state)
            monkeypatch.setattr(module, name, kernels[name])
    return kernels, state


def _attention(sizes, k, dim=19):
    ptr = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    leaves = [torch.zeros(int(ptr[-1]), 2, dim, requires_grad=True) for _ in range(3)]
    out = triton_attention.triton_kmip_attention(*leaves, k, ptr, max(sizes), 0.5)[0]
    torch.autograd.grad(out.sum(), leaves)


def test_every_launch_runs_inside_the_guard_of_its_inputs_device(recorded):
    kernels, state = recorded
    query = torch.zeros(30, 2, 16)
    plan = search_plan(16, 4, SM90_SHARED_MEMORY)
    triton_kernel.launch_topk_kernel(query, query, 4, torch.tensor([0, 10, 30]), plan)
    _attention([5, 9], 3)
    assert [len(kernels[name].launches) for name in kernels] == [1, 1, 1]
    assert all(launch["guarded"] for kernel in kernels.values() for launch in kernel.launches)
    assert state["devices"] == [query.device] * 3


def test_the_search_launch_takes_its_blocks_and_stages_from_the_plan(recorded):
    kernels, _ = recorded
    query = torch.zeros(100, 1, 160)
    plan = search_plan(160, 6, SM90_SHARED_MEMORY)
    triton_kernel.launch_topk_kernel(query, query, 6, torch.tensor([0, 70, 100]), plan)
    (launch,) = kernels["_topk_kernel"].launches
    assert launch["constants"] == {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_D": 256, "K_PAD": 16, "num_stages": 3}
    assert launch["grid"] == (3 + 1, 1)  # 70 queries in three 32-row blocks, 30 in one


def test_the_fused_kernels_compile_per_bucket_of_k_not_per_graph_size(recorded):
    """Batches whose largest graph takes every size 1..256, with k = 64 clamped to it: k reaches the
    kernels as a runtime argument and their compile-time constants take at most 5 x 7 values."""
    kernels, _ = recorded
    for size in range(1, 257):
        _attention([size], min(64, size))
    for name in ("_forward_kernel", "_backward_kernel"):
        launches = kernels[name].launches
        assert len(launches) == 256
        variants = {tuple(sorted(launch["constants"].items())) for launch in launches}
        assert len(variants) <= 5 * 7, name
        assert {launch["args"][-1] for launch in launches} == set(range(1, 65))  # k, last positional


def test_device_guard_enters_the_cuda_device_of_the_inputs(monkeypatch):
    entered = []

    class Device:
        """Stands for ``torch.cuda.device``: records the device entered and left."""

        def __init__(self, device):
            self.device = device

        def __enter__(self):
            entered.append(("enter", self.device))

        def __exit__(self, *exc):
            entered.append(("exit", self.device))

    monkeypatch.setattr(torch.cuda, "device", Device)
    with device_guard(torch.device("cuda", 1)):
        assert entered == [("enter", torch.device("cuda", 1))]
    assert entered[-1] == ("exit", torch.device("cuda", 1))
    entered.clear()
    with device_guard(torch.device("cpu")):
        pass
    assert entered == []
