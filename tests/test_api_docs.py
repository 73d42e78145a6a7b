"""docs/api.md names every public name of every public package, and nothing that no longer exists."""

import importlib
import re
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"
PACKAGES = ("ops", "grf", "nn", "distributed", "data", "train", "analysis", "configs", "logs")


def _documented() -> dict[str, set[str]]:
    sections = re.split(r"^## `kmipgt\.(\w+)`$", API.read_text(), flags=re.MULTILINE)[1:]
    return {
        package: set(re.findall(r"^\| `(\w+)` \|", text, flags=re.MULTILINE))
        for package, text in zip(sections[::2], sections[1::2], strict=True)
    }


@pytest.mark.parametrize("package", PACKAGES)
def test_api_page_lists_exactly_the_public_names(package):
    module = importlib.import_module(f"kmipgt.{package}")
    assert _documented()[package] == set(module.__all__)
