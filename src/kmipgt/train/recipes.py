"""Starting recipes for a graph of one's own: the shipped config of each task level that ``kmipgt train
--data PATH`` trains when no config is given, chosen by the level read from the data."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kmipgt.train.config_reading import parse_override

__all__ = ["STARTING_RECIPES", "data_overrides", "starting_recipe"]

# Task level -> the shipped config a new graph starts from (docs/training.md, "Starting recipes").
STARTING_RECIPES = {"node": "start_node", "graph": "start_graph", "edge": "start_edge"}


def starting_recipe(data: Any, overrides: Sequence[str] = ()) -> str:
    """The starting recipe for ``data`` (a path ``--data`` takes, a ``Data``, a list of them or a PyG
    ``Dataset``): of ``task.level`` where ``overrides`` set it, else of the level read from the data (one
    graph: node; a set of graphs: graph, or node where every node has a label)."""
    given = dict(parse_override(text) for text in overrides).get("task.level")
    if given is None:
        from torch_geometric.data import Data
        from torch_geometric.data import Dataset as PyGDataset

        from kmipgt.data.user_files import load_file
        from kmipgt.train.task_inference import infer_level

        raw = load_file(data) if isinstance(data, (str, Path)) else data
        if isinstance(raw, PyGDataset):
            raw = raw[0] if len(raw) == 1 else [raw[i] for i in range(len(raw))]
        if isinstance(raw, (list, tuple)) and len(raw) == 1:
            raw = raw[0]
        given = "node" if isinstance(raw, Data) else infer_level(raw if isinstance(raw, dict) else {"": raw})
    if given not in STARTING_RECIPES:
        raise ValueError(f"task.level must be one of {tuple(STARTING_RECIPES)}, got {given!r}")
    return STARTING_RECIPES[given]


def data_overrides(path: str | Path) -> list[str]:
    """The overrides of ``--data PATH``: dataset ``file`` at the absolute path (so that the run folder's
    config finds it from anywhere), the run in ``runs/<PATH's stem>``."""
    path = Path(path).resolve()
    if not path.exists():
        raise FileNotFoundError(f"--data: no file or folder {path}")
    quoted = str(path).replace("'", "''")
    return ["data.name=file", f"data.options={{path: '{quoted}'}}", f"out_dir=runs/{path.stem}"]
