"""A configured ``cuda:N`` becomes the current CUDA device, so launches without a guard run on GPU N."""

from __future__ import annotations

import pytest
import torch

from kmipgt.train.runtime import resolve_device


@pytest.mark.parametrize(
    ("name", "made_current"),
    [("cuda:1", [torch.device("cuda", 1)]), ("cuda:0", [torch.device("cuda", 0)]), ("cuda", []), ("cpu", [])],
)
def test_a_cuda_device_with_an_index_is_made_current(name, made_current, monkeypatch):
    current = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    assert resolve_device(name) == torch.device(name)
    assert current == made_current


def test_without_cuda_the_device_is_left_to_torch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: pytest.fail("set_device without CUDA"))
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert resolve_device("auto") == torch.device("cpu")
