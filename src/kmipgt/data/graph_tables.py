"""A graph given as two tables, its edges and its nodes (CSV, or Parquet with the extra ``parquet``).

Node table: ``id`` (integers or strings, each once), ``label``, an optional ``split`` (``train``, ``val``,
``test``, or empty: in no split) and feature columns (numbers). Edge table: ``source`` and ``target`` (ids of
the node table) and optional feature columns (numbers). The graph's nodes are the node table's rows, in
order. Every value is checked as read: a bad one is a one-line ValueError naming the file and the column.
"""

from __future__ import annotations

import csv
import reprlib
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data

from kmipgt.data.graph_checks import check_class_labels, check_node_rows

__all__ = ["TABLE_SUFFIXES", "load_graph_tables", "read_table"]

TABLE_SUFFIXES = (".csv", ".parquet")
SPLITS = ("train", "val", "test")
NODE_COLUMNS = ("id", "label", "split")  # the node table's columns that are no features
EDGE_COLUMNS = ("source", "target")

Table = dict[str, np.ndarray]  # column name -> one value per row (numbers, or objects: str, int, None)


def read_table(path: Path) -> Table:
    """The columns of the CSV or Parquet table at ``path`` (picked by its extension)."""
    return _read_parquet(path) if path.suffix.lower() == ".parquet" else _read_csv(path)


def _read_csv(path: Path) -> Table:
    """Every column as text (the values' types are read later, column by column)."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as handle:
            rows = [row for row in csv.reader(handle, skipinitialspace=True) if row]  # a blank line is no row
    except (UnicodeDecodeError, csv.Error) as error:
        raise ValueError(f"{path} is not a readable CSV table: {error}") from None
    if not rows:
        raise ValueError(f"{path} is empty: a table starts with a header line naming its columns")
    header, body = rows[0], rows[1:]
    for line, row in enumerate(body, 2):
        if len(row) != len(header):
            raise ValueError(f"{path}: line {line} has {len(row)} fields, the header {len(header)}")
    return _columns(path, header, [_objects(column) for column in zip(*body)] or [_objects([])] * len(header))


def _read_parquet(path: Path) -> Table:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError("reading Parquet needs pyarrow: pip install 'kmipgt[parquet]' (or write .csv)") \
            from None
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a readable Parquet table: {reason}") from None

    def values(column: pa.ChunkedArray) -> np.ndarray:
        # NumPy would turn integers with a gap into floats with NaN: only gapless numbers become NumPy's.
        numeric = any(test(column.type) for test in (pa.types.is_integer, pa.types.is_floating,
                                                      pa.types.is_boolean))
        return column.to_numpy() if numeric and column.null_count == 0 else _objects(column.to_pylist())

    return _columns(path, table.column_names, [values(column) for column in table.columns])


def _objects(values: Sequence[object]) -> np.ndarray:
    array = np.empty(len(values), dtype=object)
    array[:] = values  # element by element, also where the values are lists
    return array


def _columns(path: Path, names: list[str], columns: list[np.ndarray]) -> Table:
    repeated = {name for name in names if names.count(name) > 1}
    if repeated:
        raise ValueError(f"{path}: column {_shown(min(repeated))} appears twice")
    return dict(zip(names, columns))


def _shown(value: object) -> str:
    """``value`` as messages show it: a short repr, of the Python value where NumPy holds it."""
    return reprlib.repr(value.item() if isinstance(value, np.generic) else value)


def _missing(values: np.ndarray) -> np.ndarray:
    """Which ``values`` are empty: blank text, None or NaN (how CSV and Parquet leave a value out)."""
    if values.dtype != object:
        return np.isnan(values) if values.dtype.kind == "f" else np.zeros(len(values), dtype=bool)
    return np.array([v is None or (isinstance(v, str) and not v.strip()) or (isinstance(v, float) and v != v)
                     for v in values], dtype=bool)


def _parsed(values: np.ndarray, dtype: type) -> np.ndarray | None:
    """``values`` as ``dtype`` numbers, or None where one is no such number; integers are never read from
    floats (``1.5`` is no class id, and Parquet's ``1.0`` says the column holds measurements)."""
    if values.dtype.kind in "biu" or (values.dtype.kind == "f" and dtype is np.float64):
        return values.astype(dtype)
    if values.dtype.kind == "f":
        return None
    try:  # through text, so that a Python float is never truncated to an integer
        return np.array([str(v) for v in values], dtype=str).astype(dtype)
    except (ValueError, OverflowError):
        return None


def _is_number(value: object) -> bool:
    return _parsed(_objects([value]), np.float64) is not None


def _require(table: Table, names: Sequence[str], path: Path, why: str) -> None:
    for name in names:
        if name not in table:
            columns = ", ".join(map(repr, list(table)[:12])) + (", ..." if len(table) > 12 else "")
            raise ValueError(f"{path} has no column {name!r} ({why}); its columns: {columns or 'none'}")


def _node_ids(values: np.ndarray, path: Path) -> list[int | str]:
    """The ids as Python ints when every one is an integer, else as text; ValueError naming an empty or a
    repeated one."""
    empty = np.flatnonzero(_missing(values))
    if empty.size:
        raise ValueError(f"{path}: column 'id' is empty in row {int(empty[0]) + 1}: every node needs an id")
    integers = _parsed(values, np.int64)
    ids = integers.tolist() if integers is not None else [str(v) for v in values]
    counts = Counter(ids)
    if len(counts) < len(ids):
        repeated = next(key for key in ids if counts[key] > 1)
        raise ValueError(f"{path}: column 'id' holds {_shown(repeated)} twice: node ids must be unique")
    return ids


def _id_key(value: object, integers: bool) -> int | str:
    """``value`` as the node ids are held: an edge table's ``"7"`` finds node 7 when the ids are integers."""
    if integers:
        try:
            return int(str(value))
        except ValueError:
            pass
    return str(value)


def _edge_rows(values: np.ndarray, rows: dict[int | str, int], column: str, path: Path,
               nodes: Path) -> Tensor:
    """The node table's rows of the ids in edge column ``column``; ValueError naming an id it lacks."""
    integers = isinstance(next(iter(rows), ""), int)
    found = [rows.get(_id_key(value, integers), -1) for value in values]
    if -1 in found:
        unknown = values[found.index(-1)]
        raise ValueError(f"{path}: column {column!r} holds {_shown(unknown)}, which is no id of "
                         f"{nodes}")
    return torch.tensor(found, dtype=torch.long)


def _feature_columns(table: Table, chosen: Sequence[str] | None, reserved: Sequence[str],
                     path: Path) -> list[str]:
    """``chosen`` (each checked to be a column and no reserved one), or every column but the reserved ones."""
    if chosen is None:
        return [name for name in table if name not in reserved]
    _require(table, chosen, path, "named as a feature")
    taken = [name for name in chosen if name in reserved]
    if taken:
        raise ValueError(f"{path}: column {taken[0]!r} cannot be a feature: it is the {taken[0]} column")
    return list(chosen)


def _features(table: Table, columns: list[str], path: Path, row_name: Callable[[int], str]) -> Tensor:
    """The ``columns`` side by side as float32 ``[R, len(columns)]``; ValueError naming the column and row of
    the first value that is no finite number."""
    matrix = np.empty((len(table[columns[0]]), len(columns)), dtype=np.float32)
    for index, name in enumerate(columns):
        numbers = _parsed(table[name], np.float64)
        if numbers is None:
            row = next(row for row, value in enumerate(table[name]) if not _is_number(value))
            raise ValueError(f"{path}: column {name!r} holds {_shown(table[name][row])} "
                             f"({row_name(row)}), not a number: features must be numbers")
        with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused below
            matrix[:, index] = numbers
        bad = np.flatnonzero(~np.isfinite(matrix[:, index]))
        if bad.size:
            row = int(bad[0])
            raise ValueError(f"{path}: column {name!r} holds {numbers[row]} ({row_name(row)}): features must "
                             "be finite numbers (no NaN, no infinity, within float32)")
    return torch.from_numpy(matrix)


def _labels(values: np.ndarray, path: Path) -> tuple[Tensor, list[str] | None]:
    """``y`` and the class names: integers are class ids (int64, -1 where empty), other numbers regression
    targets (float32, NaN where empty), text class names (ids in the names' sorted order, -1 where empty)."""
    given = ~_missing(values)
    integers = _parsed(values[given], np.int64)
    if integers is not None:
        check_class_labels(torch.from_numpy(integers), f"{path}: column 'label'")
        classes = np.full(len(values), -1, dtype=np.int64)
        classes[given] = integers
        return torch.from_numpy(classes), None
    numbers = _parsed(values[given], np.float64)
    if numbers is not None:
        if np.isinf(numbers).any():
            raise ValueError(f"{path}: column 'label' holds an infinite value: targets must be finite")
        targets = np.full(len(values), np.nan, dtype=np.float32)
        targets[given] = numbers
        return torch.from_numpy(targets), None
    names = sorted({str(value) for value in values[given]})
    ids = {name: index for index, name in enumerate(names)}
    return torch.tensor([ids[str(value)] if keep else -1 for value, keep in zip(values, given)]), names


def _split_masks(values: np.ndarray, path: Path, row_name: Callable[[int], str]) -> dict[str, Tensor]:
    """``train_mask``, ``val_mask``, ``test_mask`` from the ``split`` column (an empty value: in no split)."""
    given = ~_missing(values)
    text = np.array([str(value).strip() if keep else "" for value, keep in zip(values, given)], dtype=object)
    unknown = np.flatnonzero(given & ~np.isin(text, SPLITS))
    if unknown.size:
        row = int(unknown[0])
        raise ValueError(f"{path}: column 'split' holds {_shown(values[row])} ({row_name(row)}); "
                         "a split is train, val, test or empty")
    return {f"{split}_mask": torch.from_numpy(text == split) for split in SPLITS}


def load_graph_tables(
    edges: Path,
    nodes: Path,
    *,
    features: Sequence[str] | None = None,
    edge_features: Sequence[str] | None = None,
) -> Data:
    """The graph of an edge table and a node table (layout in the module docstring).

    Args:
        edges, nodes: the tables' files, ``.csv`` or ``.parquet``.
        features: the node table's feature columns, in this order (default: every column but ``id``,
            ``label`` and ``split``, in the table's order).
        edge_features: the edge table's feature columns (default: every column but ``source`` and ``target``).

    Returns:
        ``Data`` with ``x`` float32 ``[N, F]``, ``edge_index`` int64 ``[2, E]`` (node table rows, one column
        per edge table row, as listed), ``y [N]`` (int64 class ids or float32 targets, see the labels),
        ``node_ids`` (the ids, a list of N ints or strs), and where the tables have them ``edge_attr`` float32
        ``[E, F_e]``, ``label_names`` (class names, a list) and boolean ``train_mask``, ``val_mask``,
        ``test_mask`` ``[N]``.
    """
    node_table, edge_table = read_table(nodes), read_table(edges)
    _require(node_table, ("id", "label"), nodes, "a node table has id and label")
    _require(edge_table, EDGE_COLUMNS, edges, "an edge table has source and target")
    ids = _node_ids(node_table["id"], nodes)
    rows = {key: row for row, key in enumerate(ids)}
    node_columns = _feature_columns(node_table, features, NODE_COLUMNS, nodes)
    if not node_columns:
        raise ValueError(f"{nodes} has no feature columns (columns besides id, label and split)")

    def node(row: int) -> str:
        return f"node {_shown(ids[row])}"

    def edge(row: int) -> str:
        return f"edge {_shown(edge_table['source'][row])} -> {_shown(edge_table['target'][row])}"

    x = _features(node_table, node_columns, nodes, node)
    check_node_rows(x, f"{nodes}: features")
    graph = Data(x=x, edge_index=torch.stack([_edge_rows(edge_table[column], rows, column, edges, nodes)
                                              for column in EDGE_COLUMNS]), node_ids=ids)
    graph.y, names = _labels(node_table["label"], nodes)
    if names is not None:
        graph.label_names = names
    edge_columns = _feature_columns(edge_table, edge_features, EDGE_COLUMNS, edges)
    if edge_columns:
        graph.edge_attr = _features(edge_table, edge_columns, edges, edge)
    if "split" in node_table:
        for key, mask in _split_masks(node_table["split"], nodes, node).items():
            graph[key] = mask
    return graph
