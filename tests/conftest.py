"""Shared fixtures and markers.

Markers (declared in pyproject.toml): ``@pytest.mark.cuda`` skips without a CUDA device;
``@pytest.mark.requires("faiss", ...)`` skips unless every named module is importable. Both also work as
``pytest.param(..., marks=...)`` marks.
"""

import importlib.util

import pytest
import torch


@pytest.fixture(autouse=True)
def _private_label_cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache directory, so no test reads another's (or the user's) cache."""
    monkeypatch.setenv("KMIPGT_CACHE", str(tmp_path / "kmipgt_cache"))


def pytest_runtest_setup(item):
    if item.get_closest_marker("cuda") is not None and not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for marker in item.iter_markers("requires"):
        missing = [name for name in marker.args if importlib.util.find_spec(name) is None]
        if missing:
            pytest.skip(f"needs {', '.join(missing)}")


def ragged_tokens(
    sizes,
    count=2,
    heads=2,
    dim=6,
    dtype=torch.float32,
    seed=0,
    integer=False,
    scale=1.0,
):
    """``count`` token tensors ``[N, heads, dim]`` for graphs of ``sizes`` nodes, then their ``ptr``.

    ``integer`` draws small integers, so float32 products and sums are exact (and tie).
    """
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    ptr = torch.tensor([0, *torch.tensor(sizes, dtype=torch.long).cumsum(0).tolist()])

    def draw():
        if integer:
            return torch.randint(-3, 4, (n, heads, dim), generator=gen).to(dtype)
        return (scale * torch.randn(n, heads, dim, generator=gen, dtype=torch.float64)).to(dtype)

    return (*(draw() for _ in range(count)), ptr)


@pytest.fixture
def ragged():
    """The :func:`ragged_tokens` builder: ``ragged(sizes, count=2, ...)`` -> ``(*tokens, ptr)``."""
    return ragged_tokens
