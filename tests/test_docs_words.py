"""README.md and docs/ describe things by what they are: no tracker numbers, no "the issue", "the team" or
"session" (words of how the work was organised, which a reader cannot look up)."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
INTERNAL = re.compile(
    r"\bissues?\s+(?:#?\d|§)"  # issue 16, issue #16, issue §3
    r"|(?<![\w/&#-])#\d+\b"  # #16 (not a URL fragment or an HTML entity)
    r"|\bthe (?:attention )?issue\b|\bissue's"
    r"|\bthe team\b"
    r"|\bsessions?\b",
    re.IGNORECASE,
)


@pytest.mark.parametrize("text", [
    "Every case of issue 16", "see #16", "(issue §3)", "the attention issue's targets", "The issue asks",
    "as the team runs it", "in a later session",
])
def test_the_pattern_finds_internal_words(text):
    assert INTERNAL.search(text)


@pytest.mark.parametrize("text", [
    "https://github.com/pyg-team/pytorch_geometric/issues/1234", "[k-MIP](kmip.md#3-results)", "&#8212;",
    "## 3. Results", "k-MIP issues no host sync", "§16 of the study",
])
def test_the_pattern_leaves_ordinary_text_alone(text):
    assert not INTERNAL.search(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_no_internal_words(page):
    lines = enumerate(page.read_text().splitlines(), 1)
    found = [f"{number}: {match.group()!r}" for number, line in lines for match in INTERNAL.finditer(line)]
    assert not found, f"{page.name}: " + "; ".join(found)
