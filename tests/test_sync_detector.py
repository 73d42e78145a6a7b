"""The CPU host-sync detector (tests/sync_detector.py): every pattern that waits for a CUDA device is
recorded, sync-free computations are not, and host data is told apart from device data."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.nn import global_mean_pool
from torch_geometric.utils import scatter

from sync_detector import HostSyncs

_X = torch.tensor([1.0, -2.0, 3.0, 3.0])
_COUNTS = torch.tensor([1, 0, 2, 1])


def _recorded(run, on_device=None) -> list[str]:
    with HostSyncs(on_device) as syncs:
        run()
    return [sync.op for sync in syncs.syncs]


def _branch_on_value(x):
    if x.sum() > 0:
        return x
    return -x


def _index_put_with_mask(x):
    x = x.clone()
    x[x > 0] = 0.0
    return x


_READ = "aten._local_scalar_dense.default"
# pattern -> (what runs it on a device tensor x, the op it is recorded as)
SYNCING = {
    "item": (lambda x: x.sum().item(), _READ),
    "int": (lambda x: int(x.max()), _READ),
    "float": (lambda x: float(x.sum()), _READ),
    "bool": (lambda x: bool((x > 0).any()), _READ),
    "branch on a value": (_branch_on_value, _READ),
    "boolean mask": (lambda x: x[x > 0], "aten.index.Tensor with a boolean mask"),
    "boolean mask write": (_index_put_with_mask, "aten.index_put_.default with a boolean mask"),
    "nonzero": (lambda x: x.nonzero(), "aten.nonzero.default"),
    "where of a mask": (lambda x: torch.where(x > 0), "aten.nonzero.default"),
    "masked_select": (lambda x: x.masked_select(x > 0), "aten.masked_select.default"),
    "unique": (lambda x: torch.unique(x), "aten._unique2.default"),
    "unique with counts": (lambda x: torch.unique(x, return_counts=True), "aten._unique2.default"),
    "unique rows": (lambda x: torch.unique(x.view(2, 2), dim=0), "aten.unique_dim.default"),
    "unique_consecutive": (lambda x: torch.unique_consecutive(x), "aten.unique_consecutive.default"),
    "repeat_interleave of counts": (
        lambda x: torch.repeat_interleave(_COUNTS), "aten.repeat_interleave.Tensor without output_size"
    ),
    "repeat_interleave by counts": (
        lambda x: x.repeat_interleave(_COUNTS), "aten.repeat_interleave.Tensor without output_size"
    ),
    "bincount": (lambda x: torch.bincount(_COUNTS), "aten.bincount.default"),
    "equal": (lambda x: torch.equal(x, x), "aten.equal.default"),
    "tolist": (lambda x: x.tolist(), "Tensor.tolist"),
    "tolist of a scalar": (lambda x: x.sum().tolist(), "Tensor.tolist"),
    "numpy": (lambda x: x.numpy(), "Tensor.numpy"),
    "np.asarray": (lambda x: np.asarray(x), "Tensor.__array__"),
    "cpu": (lambda x: x.cpu(), "Tensor.cpu"),
}


@pytest.mark.parametrize(("run", "op"), SYNCING.values(), ids=SYNCING.keys())
def test_each_syncing_pattern_is_recorded_once(run, op):
    assert _recorded(lambda: run(_X.clone())) == [op]


class _ReadsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * float(grad.abs().max())


def test_a_sync_in_backward_is_recorded_with_its_caller():
    x = _X.clone().requires_grad_()
    loss = _ReadsInBackward.apply(x).sum()
    with HostSyncs() as syncs:
        loss.backward()
    assert [sync.op for sync in syncs.syncs] == ["aten._local_scalar_dense.default"]
    assert "test_sync_detector.py" in syncs.syncs[0].where and "in backward" in syncs.syncs[0].where


def _sync_free():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(6, 3, generator=gen, requires_grad=True)
    batch = torch.tensor([0, 0, 1, 1, 1, 2])
    index = torch.tensor([2, 0, 1])
    h = x @ torch.randn(3, 4, generator=gen)
    pooled = torch.zeros(3, 4).index_add_(0, batch, h)
    picked = h.gather(0, index.view(3, 1).expand(3, 4))
    summed = scatter(h, batch, dim=0, dim_size=3, reduce="sum")
    mean = global_mean_pool(h, batch, size=3)
    spread = h[:3].repeat_interleave(torch.tensor([1, 2, 3]), dim=0, output_size=6)
    masked = h.masked_fill(h > 0, 0.0)
    top = h.topk(2, dim=1).values
    loss = (pooled.sum() + picked.sum() + summed.sum() + mean.sum() + spread.sum() + masked.sum()
            + top.sum() + h[index].sum())
    loss.backward()


def test_sync_free_computations_record_nothing():
    assert _recorded(_sync_free) == []


def test_values_of_host_tensors_are_read_without_a_sync():
    x = torch.randn(5)
    ptr = torch.tensor([0, 2, 5])

    def run():
        sizes = ptr.diff()
        int(sizes.max())
        torch.repeat_interleave(sizes).tolist()
        (sizes > 0).nonzero()
        x * float(ptr[-1])

    assert _recorded(run, on_device=[x]) == []


def test_what_is_computed_from_device_tensors_is_on_the_device():
    x = torch.randn(5)
    host = torch.arange(5)

    def run():
        (x * 2).sum().item()
        torch.zeros(5).index_add_(0, host, x).max().item()  # written in place from device values
        torch.arange(3, device=x.device).tolist()  # a factory given a device
        x.to("cpu")
        torch.tensor([1, 2], device=x.device)  # a blocking copy of host data
        host.to(x.device, torch.float)
        host.to(x.device, torch.float, non_blocking=True)
        torch.empty(5).copy_(x)  # a blocking copy back to the host
        x.new_empty(5).copy_(x)  # a copy on the device

    assert _recorded(run, on_device=[x]) == [
        "aten._local_scalar_dense.default",
        "aten._local_scalar_dense.default",
        "Tensor.tolist",
        "Tensor.to('cpu')",
        "torch.tensor(..., device=...) (a blocking host-to-device copy)",
        "Tensor.to(device) of a host tensor without non_blocking=True",
        "aten.copy_.default of a device tensor into a host tensor",
    ]
