"""configs/synthetic_london.yaml: London's size and the memory settings, and it trains on a tiny city."""

import math

from kmipgt.train import load_config, train


def test_london_size_and_the_issue_settings():
    config = load_config("synthetic_london")
    # City-Networks London (reference/datasets.md §3.4): 568,795 nodes, 756,502 undirected roads.
    assert config.data.options == {"num_nodes": 568795, "num_edges": 756502, "seed": 0}
    m, a = config.model, config.model.attention
    assert (m.num_layers, m.channels, a.heads, a.k) == (8, 64, 4, 16)
    assert (m.local, a.kind) == ("gatedgcn", "kmip")
    assert a.options == {"backend": "ivf", "recall": 0.95} and m.checkpoint
    # glibc's default allocator, as the London runs in docs/scaling.md were measured (KMIPGT_SYSTEM_MALLOC=1)
    assert config.allocator == "system"


def test_trains_on_a_tiny_city_with_the_same_settings(tmp_path):
    config = load_config("synthetic_london", [
        "data.options={num_nodes: 400, num_edges: 520, seed: 0}", "optim.epochs=2", "optim.eval_every=1",
        f"out_dir={tmp_path}",
    ])
    metrics = train(config, progress=False)
    assert metrics["complete"] and metrics["epochs"] == 2
    assert all(math.isfinite(metrics[split]) for split in ("train", "val", "test"))
