"""docs/index.md is the map of the docs: it links every page once, and every link of it exists."""

import re
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"


def test_the_index_links_every_page_and_only_pages_that_exist():
    links = re.findall(r"\]\(([^)#]+)\)", (DOCS / "index.md").read_text())
    pages = [link for link in links if link.endswith(".md") and "/" not in link]
    assert sorted(pages) == sorted(path.name for path in DOCS.glob("*.md") if path.name != "index.md")
    assert all((DOCS / link).exists() for link in links)
