"""kmipgt bench train: one `kmipgt train` process per point, budget skips, fitted log-log slopes."""

import json

import pytest

from kmipgt.bench.train import TrainBenchConfig, _train_args, fitted_slopes, run_train_benchmark
from kmipgt.cli import main
from planted import plant_modules

# Two tiny GPS layers: each point is a few seconds, most of them the interpreter start.
SMALL = ["model.num_layers=1", "model.channels=8", "model.attention.heads=2"]


def bench_config(**kwargs) -> TrainBenchConfig:
    """A config whose cities have the generator's own road count (the default is London's)."""
    return TrainBenchConfig(**{"edges_per_node": 0.0, **kwargs})


def test_measures_each_point_in_its_own_run_and_fits_slopes(tmp_path):
    config = bench_config(n_values=[400, 200], methods=["none"], epochs=1, overrides=SMALL)
    result = run_train_benchmark(config, tmp_path)
    points = result["points"]
    assert [(p["method"], p["n"], p["status"]) for p in points] == [("none", 200, "ok"), ("none", 400, "ok")]
    assert all(p["time_per_epoch"] > 0 and p["peak_memory_bytes"] > 2**20 for p in points)
    assert set(result["slopes"]["time_per_epoch"]) == {"none"}
    assert (tmp_path / "train.json").is_file() and (tmp_path / "train.png").is_file()


def test_slopes_are_least_squares_on_log_log():
    records = [{"method": "a", "status": "ok", "n": n, "t": 3.0 * n**1.5} for n in (10, 100, 1000)]
    records.append({"method": "a", "status": "skipped", "n": 10000})
    assert fitted_slopes(records, "t") == {"a": 1.5}


def test_a_point_predicted_over_the_memory_budget_is_skipped(tmp_path):
    config = bench_config(n_values=[200, 100000], methods=["none"], epochs=1, overrides=SMALL,
                          memory_budget_gb=1.0, time_budget=1e6)
    points = run_train_benchmark(config, tmp_path)["points"]
    assert points[0]["status"] == "ok"
    assert points[1]["status"] == "skipped" and "memory" in points[1]["reason"]


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"n_values": [10]}, "n_values"), ({"n_values": [100], "methods": ["flash"]}, "unknown methods"),
    ({"n_values": [100], "epochs": 0}, "positive"), ({"n_values": [100], "allocator": "tc"}, "'allocator'"),
])
def test_bad_configs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench_config(**kwargs)


@pytest.mark.parametrize(("kwargs", "policy"), [({}, "live"), ({"allocator": "system"}, "system")])
def test_each_point_gets_the_allocator_as_a_config_key(tmp_path, kwargs, policy):
    # Passed on the child's command line, not through environment variables; the user's --set still wins.
    args = _train_args(bench_config(n_values=[100], **kwargs), "none", 100, tmp_path)
    assert args[args.index(f"allocator={policy}") - 1] == "--set"
    config = bench_config(n_values=[100], overrides=["allocator=retain"])
    args = _train_args(config, "none", 100, tmp_path)
    assert args.index("allocator=retain") > args.index("allocator=live")


def test_cli(tmp_path, capsys, monkeypatch):
    # Each point's `kmipgt train` imports nothing from the working folder (planted modules never run).
    marker = tmp_path / "marker"
    plant_modules(tmp_path, marker)
    monkeypatch.chdir(tmp_path)
    args = ["bench", "train", "--n-min", "200", "--n-max", "200", "--methods", "none", "--epochs", "1",
            "--out", str(tmp_path)]
    for setting in SMALL:
        args += ["--set", setting]
    assert main(args) == 0
    assert "s/epoch" in capsys.readouterr().out
    assert json.loads((tmp_path / "train.json").read_text())["points"][0]["n"] == 200
    assert not marker.exists()
