"""The config key ``device``: the devices torch takes are accepted, the others are one config error.

The common names are accepted without importing torch (config errors come before it); torch is the
reference for every case.
"""

import pytest
import torch

from kmipgt.train import load_config
from kmipgt.train.validation import validate_config


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12", "mps", "meta", "xpu:1"])
def test_a_device_torch_takes_is_accepted(device):
    torch.device(device if device != "auto" else "cpu")  # the reference: torch takes it
    validate_config(load_config(None, [f"device={device}"]))


@pytest.mark.parametrize("device", ["cdua", "cuda:01", "cuda:-1", "cuda:x", "auto:0"])
def test_a_device_torch_refuses_is_a_config_error(device):
    with pytest.raises(RuntimeError):
        torch.device(device)  # the reference: torch refuses it
    with pytest.raises(ValueError, match=f"config key 'device' must be 'auto' or a torch device.*{device!r}"):
        validate_config(load_config(None, [f"device={device}"]))
