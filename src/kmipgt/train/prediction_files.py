"""Prediction rows written to a file by its extension: CSV and Parquet streamed chunk by chunk (memory holds
one chunk), ``.pt`` as tensors; every file written whole or not at all (:mod:`kmipgt.atomic`).

A chunk is a dict of columns of equal length: ``split`` (a list of names), id columns (``[R]`` integer
tensors), ``predicted`` (``[R]`` or ``[R, T]``) and ``probabilities`` (``[R]`` or ``[R, C]``). In a table a
``[R, C]`` column becomes C columns named with the index: ``predicted_0``, ..., ``probability_0``, ...
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from itertools import chain
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import torch

from kmipgt.atomic import atomic_write, save_tensors

__all__ = ["FORMATS", "check_output", "collect", "write_rows"]

FORMATS = (".csv", ".parquet", ".pt")
# The name of one column of a table from each chunk key with a column per index.
SINGULAR = {"predicted": "predicted", "probabilities": "probability"}


def check_output(path: str | Path) -> Path:
    """``path`` if predictions can be written there: a known extension, an existing folder, pyarrow for
    Parquet (ImportError naming the extra otherwise); checked before any prediction is made."""
    path = Path(path)
    if path.suffix not in FORMATS:
        raise ValueError(f"the output's extension picks its format, one of {', '.join(FORMATS)}; got {path}")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"no folder {path.parent} for {path.name}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet  # noqa: F401
        except ImportError:
            message = "writing Parquet needs pyarrow: pip install 'kmipgt[parquet]' (or write .csv)"
            raise ImportError(message) from None
    return path


def _table(chunk: dict[str, Any]) -> dict[str, list | np.ndarray]:
    """The chunk's columns as a table's: one per index of a 2-D column."""
    table: dict[str, list | np.ndarray] = {}
    for key, column in chunk.items():
        if not isinstance(column, torch.Tensor):
            table[key] = column
        elif column.dim() == 1:
            table[SINGULAR.get(key, key)] = column.numpy()
        else:
            for index, values in enumerate(column.T):
                table[f"{SINGULAR.get(key, key)}_{index}"] = values.numpy()
    return table


def _text(column: list | np.ndarray) -> list[str] | np.ndarray:
    # numpy prints a float32 in the fewest digits that read back as the same number (0.1, not 0.100000001).
    return column.astype(str) if isinstance(column, np.ndarray) else column


def _write_csv(chunks: Iterable[dict[str, Any]], handle: BinaryIO) -> int:
    text = io.TextIOWrapper(handle, encoding="utf-8", newline="")
    writer = csv.writer(text)
    rows = 0
    for index, chunk in enumerate(chunks):
        table = _table(chunk)
        if index == 0:
            writer.writerow(table)
        writer.writerows(zip(*(_text(column) for column in table.values())))
        rows += len(next(iter(table.values())))
    text.flush()
    text.detach()  # the handle stays open for atomic_write, which syncs and closes it
    return rows


def _write_parquet(chunks: Iterable[dict[str, Any]], handle: BinaryIO) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, rows = None, 0
    try:
        for chunk in chunks:
            table = pa.table(_table(chunk))
            if writer is None:
                writer = pq.ParquetWriter(handle, table.schema)
            writer.write_table(table)  # one row group per chunk: nothing before it is held
            rows += table.num_rows
    finally:
        # Closed here even on a failure: closed later, when collected, it would write to a closed handle.
        if writer is not None:
            writer.close()
    return rows


def collect(chunks: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The chunks as one: lists joined, tensors concatenated along their rows."""
    parts: dict[str, list] = {}
    for chunk in chunks:
        for key, column in chunk.items():
            parts.setdefault(key, []).append(column)
    return {key: torch.cat(columns) if isinstance(columns[0], torch.Tensor) else list(chain(*columns))
            for key, columns in parts.items()}


def write_rows(path: str | Path, chunks: Iterable[dict[str, Any]]) -> int:
    """Write the rows of ``chunks`` to ``path`` (:func:`check_output` first), in the format of its extension;
    the number of rows. A failure part-way leaves no file (and any earlier file at ``path`` as it was)."""
    path = check_output(path)
    if path.suffix == ".pt":
        content = collect(chunks)
        save_tensors(content, path)
        return len(content.get("split", []))
    write: Callable[[Iterable[dict[str, Any]], BinaryIO], int] = (
        _write_csv if path.suffix == ".csv" else _write_parquet
    )
    rows = 0

    def written(handle: BinaryIO) -> None:
        nonlocal rows
        rows = write(chunks, handle)

    atomic_write(path, written)
    return rows
