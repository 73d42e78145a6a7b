import pytest


@pytest.fixture(autouse=True)
def _private_label_cache(tmp_path, monkeypatch):
    """Every test gets its own empty cache directory, so no test reads another's (or the user's) cache."""
    monkeypatch.setenv("KMIPGT_CACHE", str(tmp_path / "kmipgt_cache"))
