"""Fixtures of the training tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def _keep_thread_count():
    """A Trainer sets torch's thread count for its run; later tests keep their own."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
