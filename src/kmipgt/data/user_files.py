"""A user's own graph read from a path: the dataset ``file`` (``data: {name: file, options: {path: PATH}}``).

``PATH`` is one of

- a ``.pt`` file written by ``torch.save``: a PyG ``Data``, a list of ``Data`` or ``{"train": [...], "val":
  [...], "test": [...]}`` (:mod:`kmipgt.data.graph_file`);
- a folder holding an edge table and a node table, ``edges.csv`` and ``nodes.csv`` (or ``.parquet``);
- an edge table, ``.csv`` or ``.parquet``, with its node table named by ``nodes``
  (:mod:`kmipgt.data.graph_tables` describes the tables).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from torch_geometric.data import Data

from kmipgt.data.graph_file import load_saved_graphs
from kmipgt.data.graph_tables import TABLE_SUFFIXES, load_graph_tables

__all__ = ["load_file"]

SAVED_SUFFIXES = (".pt", ".pth")


def _table_in(folder: Path, stem: str) -> Path:
    """The one ``<stem>.csv`` or ``<stem>.parquet`` in ``folder``."""
    found = [table for suffix in TABLE_SUFFIXES if (table := folder / f"{stem}{suffix}").is_file()]
    if not found:
        raise FileNotFoundError(f"{folder} holds no {stem}.csv or {stem}.parquet: a graph folder holds "
                                "edges.csv and nodes.csv (or .parquet)")
    if len(found) > 1:
        raise ValueError(f"{folder} holds both {found[0].name} and {found[1].name}: keep one")
    return found[0]


def _node_table(path: str | Path) -> Path:
    """``path`` when it is a table file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no node table at {path}")
    if path.suffix.lower() not in TABLE_SUFFIXES:
        raise ValueError(f"{path}: a node table is .csv or .parquet, got {path.suffix or 'no extension'}")
    return path


def _column_names(names: str | Sequence[str] | None) -> list[str] | None:
    # A config may name one column without a list (`features: degree`).
    return [names] if isinstance(names, str) else None if names is None else list(names)


def load_file(
    path: str | Path,
    *,
    nodes: str | Path | None = None,
    features: str | Sequence[str] | None = None,
    edge_features: str | Sequence[str] | None = None,
) -> Data | list[Data] | dict[str, list[Data]]:
    """A user's own graph or graphs: graphs saved with ``torch.save``, or an edge and a node table (CSV,
    Parquet), checked as read (forms in the module docstring).

    Args:
        path: a ``.pt`` file, a folder of ``edges`` and ``nodes`` tables, or an edge table.
        nodes: the node table, where ``path`` is an edge table.
        features: the node table's feature columns (default: every column but ``id``, ``label``, ``split``).
        edge_features: the edge table's feature columns (default: every column but ``source``, ``target``).

    Returns:
        a ``.pt`` file's graphs as saved; for tables one ``Data`` (see
        :func:`~kmipgt.data.graph_tables.load_graph_tables`): ``x [N, F]``, ``edge_index [2, E]``, ``y [N]``,
        ``node_ids``, and ``edge_attr``, ``label_names``, split masks where the tables have them.

    Raises:
        FileNotFoundError: ``path`` (or ``nodes``) does not exist.
        ValueError: a file of another kind, or a value that is missing or wrong, in one line naming the file
            and the column or tensor.
    """
    path = Path(path)
    table_options = {"nodes": nodes, "features": features, "edge_features": edge_features}
    if path.is_dir():
        edges = _table_in(path, "edges")
        node_table = _table_in(path, "nodes") if nodes is None else _node_table(nodes)
    elif not path.exists():
        raise FileNotFoundError(f"no graph file at {path}")
    elif path.suffix.lower() in SAVED_SUFFIXES:
        given = [name for name, value in table_options.items() if value is not None]
        if given:
            raise ValueError(f"{path} is a saved graph: the option {given[0]} applies to tables only")
        return load_saved_graphs(path)
    elif path.suffix.lower() in TABLE_SUFFIXES:
        if nodes is None:
            raise ValueError(f"{path} is an edge table: name its node table with the option nodes, or pass a "
                             "folder holding edges.csv and nodes.csv")
        edges, node_table = path, _node_table(nodes)
    else:
        raise ValueError(f"{path}: unknown graph file extension {path.suffix or '(none)'}; expected .pt, "
                         ".csv, .parquet or a folder of edges and nodes tables")
    return load_graph_tables(edges, node_table, features=_column_names(features),
                             edge_features=_column_names(edge_features))
