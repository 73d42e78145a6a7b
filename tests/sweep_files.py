"""Sweep files for the sweep tests: a tiny synthetic-city base config and a sweep of two variants."""

from pathlib import Path

import yaml

TINY_CITY = {
    "data": {"name": "synthetic_city",
             "options": {"num_nodes": 120, "hops": 3, "num_workers": 1, "progress": False}},
    "model": {"channels": 8, "num_layers": 1, "k": 4, "heads": 2},
    "optim": {"epochs": 2, "warmup_epochs": 1},
    "device": "cpu",
    "threads": 1,
}


def write_yaml(path: Path, content: dict) -> Path:
    path.write_text(yaml.safe_dump(content, sort_keys=False))
    return path


def variants_sweep(folder: Path) -> tuple[Path, Path]:
    """The base config and a sweep of variants ``kmip`` and ``wide`` (attention off, 12 channels) over
    seeds 0 and 1, written to ``folder``."""
    base = write_yaml(folder / "base.yaml", TINY_CITY)
    path = write_yaml(folder / "variants.yaml", {
        "base": str(base),
        "set": {"optim.epochs": 7},
        "variants": {"kmip": {}, "wide": {"model.attention": "none", "model.channels": 12}},
        "grid": {"seed": [0, 1]},
    })
    return base, path
