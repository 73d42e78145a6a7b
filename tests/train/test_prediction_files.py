"""Prediction rows to CSV, Parquet and ``.pt``: one table column per class, numbers read back as written,
and a failure part-way leaving no file."""

import csv

import numpy as np
import pytest
import torch

from kmipgt.train.prediction_files import collect, write_rows


def _chunks(count: int, fail_after: int | None = None):
    generator = torch.Generator().manual_seed(0)
    for index in range(count):
        if index == fail_after:
            raise RuntimeError("a batch failed")
        rows = 3 + index
        yield {"split": ["test"] * rows, "graph": torch.full((rows,), index), "node": torch.arange(rows),
               "predicted": torch.randint(0, 4, (rows, 2), generator=generator),
               "probabilities": torch.rand(rows, 4, generator=generator)}


def test_csv_has_a_column_per_index_and_floats_that_read_back_exactly(tmp_path):
    path = tmp_path / "rows.csv"
    assert write_rows(path, _chunks(3)) == 3 + 4 + 5
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["split", "graph", "node", "predicted_0", "predicted_1",
                             "probability_0", "probability_1", "probability_2", "probability_3"]
    expected = collect(_chunks(3))
    assert [int(row["graph"]) for row in rows] == expected["graph"].tolist()
    assert [int(row["predicted_1"]) for row in rows] == expected["predicted"][:, 1].tolist()
    read = np.array([[row[f"probability_{c}"] for c in range(4)] for row in rows], dtype=np.float32)
    assert np.array_equal(read, expected["probabilities"].numpy())


def test_collect_joins_lists_and_concatenates_tensors():
    joined = collect(_chunks(2))
    assert joined["split"] == ["test"] * 7 and joined["node"].tolist() == [0, 1, 2, 0, 1, 2, 3]
    assert joined["probabilities"].shape == (7, 4)


PARQUET = pytest.param("parquet", marks=pytest.mark.requires("pyarrow"))


@pytest.mark.parametrize("suffix", ["csv", PARQUET, "pt"])
def test_a_failure_part_way_leaves_the_earlier_file_as_it_was(tmp_path, suffix):
    path = tmp_path / f"rows.{suffix}"
    path.write_bytes(b"earlier")
    with pytest.raises(RuntimeError, match="a batch failed"):
        write_rows(path, _chunks(3, fail_after=2))
    assert path.read_bytes() == b"earlier" and sorted(p.name for p in tmp_path.iterdir()) == [path.name]


@pytest.mark.requires("pyarrow")
def test_parquet_holds_one_row_group_per_chunk(tmp_path):
    import pyarrow.parquet as pq

    path = tmp_path / "rows.parquet"
    assert write_rows(path, _chunks(3)) == 12
    file = pq.ParquetFile(path)
    assert [file.metadata.row_group(i).num_rows for i in range(file.num_row_groups)] == [3, 4, 5]
    table = file.read().to_pydict()
    assert table["probability_2"] == collect(_chunks(3))["probabilities"][:, 2].tolist()
