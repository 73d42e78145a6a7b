"""Calibrated approximate search inside training: the recall it reached is logged per epoch."""

import csv

from kmipgt.cli import main


def test_calibrated_ivf_training_logs_the_search_recall(tmp_path):
    code = main([
        "train", "--no-progress", "--config", "configs/synthetic_city_graphgps.yaml",
        *("--set", f"out_dir={tmp_path}", "--set", "data.options={num_nodes: 1500, seed: 0}"),
        *("--set", "model.num_layers=2", "--set", "model.channels=16", "--set", "threads=1"),
        *("--set", "model.attention.options={backend: ivf, recall: 0.9}", "--set", "optim.epochs=2"),
        *("--set", "optim.warmup_epochs=1", "--set", "device=cpu"),
    ])
    assert code == 0
    rows = list(csv.DictReader((tmp_path / "log.csv").open()))
    assert len(rows) == 2
    # 1,500 nodes: one graph above the IVF threshold, so every layer calibrates its probing.
    assert all(0.9 <= float(row["search_recall"]) <= 1.0 for row in rows)
