"""Modules planted in a working folder, as someone who can write beside a sweep file could: each creates a
marker file when imported, so a test sees whether a child process imported it."""

from pathlib import Path

# Modules every kmipgt child imports: the config reader's and the benchmark child's.
PLANTED_MODULES = ("yaml", "json")


def plant_modules(folder: Path, marker: Path) -> None:
    """Write ``yaml.py`` and ``json.py`` into ``folder``, each touching ``marker`` when imported."""
    for name in PLANTED_MODULES:
        (folder / f"{name}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
