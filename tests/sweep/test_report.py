"""Sweep reports: the summary's markdown tables and the plot against a numeric grid key."""

import math

import pytest

from kmipgt.sweep import expand, load_sweep, paired_differences, summarize, summary_markdown
from kmipgt.sweep.report import numeric_axis, plot_summary
from sweep_files import variants_sweep


def test_summary_tables_each_variant_and_its_paired_differences(tmp_path):
    _, path = variants_sweep(tmp_path)
    sweep = load_sweep(path)
    cells = expand(sweep)
    rows = [{"variant": c.values["variant"], "seed": str(c.values["seed"]), "status": "ok", "val": 0.5,
             "test": 0.1 * i, "seconds_per_epoch": 1.0, "peak_memory_mb": 10.0} for i, c in enumerate(cells)]
    summary = summarize(rows, list(sweep.axes()))
    assert [(e["variant"], e["n"]) for e in summary] == [("kmip", 2), ("wide", 2)]
    assert summary[1]["test_mean"] == pytest.approx(0.25)
    table = summary_markdown(sweep, summary, "accuracy", "kmipgt sweep variants.yaml")
    assert '`wide`: `{"model.attention": "none", "model.channels": 12}`' in table
    assert "| variant | n | val accuracy |" in table and "| wide | 2 |" in table
    paired = paired_differences(rows, list(sweep.axes()))  # test: kmip 0.0, 0.1; wide 0.2, 0.3
    assert "Paired by" not in table
    table = summary_markdown(sweep, summary, "accuracy", "kmipgt sweep variants.yaml", paired)
    assert "over `seed`)." in table and "Paired by `seed` against variant=kmip" in table
    assert "| wide | 2 | +0.0000 ± 0.0000 | +0.2000 ± 0.0000 | 2 of 2 |" in table


def test_the_table_shows_the_epochs_each_cell_has_done(tmp_path):
    _, path = variants_sweep(tmp_path)
    sweep = load_sweep(path)
    statuses = [("ok", 7), ("unfinished", 3), ("failed", ""), ("unfinished", 0)]
    rows = [{"variant": c.values["variant"], "seed": str(c.values["seed"]), "status": status,
             "epochs": epochs, "val": 0.5, "test": 0.25, "seconds_per_epoch": 1.0, "peak_memory_mb": 10.0}
            for c, (status, epochs) in zip(expand(sweep), statuses, strict=True)]
    summary = summarize(rows, list(sweep.axes()))
    assert [entry["epochs"] for entry in summary] == ["7/3", "—/0"]
    table = summary_markdown(sweep, summary, "ap", "kmipgt sweep variants.yaml")
    assert "| variant | n | val ap | test ap | epochs done |" in table
    assert "| kmip | 1 | 0.5000 | 0.2500 | 7/3 |" in table and "| wide | 0 | — | — | —/0 |" in table


def test_one_numeric_grid_key_is_plotted_against_its_values(tmp_path):
    entry = {"test_mean": 0.5, "test_std": 0.01, "seconds_per_epoch_mean": 1.0}
    entry["seconds_per_epoch_std"] = math.nan
    summary = [{**entry, "model.attention.k": k} for k in ("16", "1", "4")]  # rows hold values as text
    assert numeric_axis(summary, ["model.attention.k"]) == [16.0, 1.0, 4.0]
    assert numeric_axis([{**entry, "lr": 0.001}], ["lr"]) == [0.001]
    assert numeric_axis([{**entry, "model.attention": "kmip"}], ["model.attention"]) is None
    assert numeric_axis([{**entry, "a": 1, "b": 2}], ["a", "b"]) is None
    assert numeric_axis([{**entry, "flag": True}, {**entry, "flag": "true"}], ["flag"]) is None
    plot_summary(tmp_path / "k.png", summary, ["model.attention.k"], "accuracy")
    assert (tmp_path / "k.png").stat().st_size > 0
