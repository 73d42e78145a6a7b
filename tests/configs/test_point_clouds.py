"""The point-cloud configs: the paper's settings, and an epoch of training on tiny sets and local copies."""

import json

import pytest

from kmipgt.cli import main
from kmipgt.train import load_config
from kmipgt.train.validation import validate_config
from point_cloud_copies import write_s3dis, write_shapenet_part

TINY_MODEL = ("model.num_layers=2", "model.channels=16", "model.attention.head_dim=4", "threads=1",
              "device=cpu", "optim.epochs=1", "optim.warmup_epochs=0", "data.batch_size=4")


def _train(config: str, out, *overrides: str) -> dict:
    sets = [arg for item in (*TINY_MODEL, f"out_dir={out}", *overrides) for arg in ("--set", item)]
    assert main(["train", "--no-progress", "--config", config, *sets]) == 0
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.parametrize("name", ["shapenet_part", "s3dis", "synthetic_parts", "synthetic_rooms"])
def test_the_paper_settings(name):
    config = load_config(name, [])
    m, a, o = config.model, config.model.attention, config.optim
    assert (m.num_layers, m.channels, a.heads, a.head_dim) == (8, 56, 4, 14)
    assert (a.k, a.options) == (10, {"qk_dim": 5})
    assert (m.norm, m.activation, m.dropout, a.kind) == ("batch", "relu", 0.1, "kmip")
    assert (o.lr, o.weight_decay, o.epochs) == (5e-4, 1e-4, 200) and config.task.level == "node"
    rooms = name in ("s3dis", "synthetic_rooms")
    assert config.data.options["k"] == (32 if rooms else 8)
    assert config.task.metric == ("miou" if rooms else "macro_f1")
    if rooms:
        assert config.data.options["test_area"] == 6
    assert config.data.options.get("stream", False) == (name == "s3dis")


def _check_reported(metrics: dict) -> None:
    assert metrics["complete"] and set(metrics["report"]) >= {"accuracy"}
    for name in (metrics["metric"], *metrics["report"]):
        values = metrics["report"].get(name, {s: metrics[s] for s in ("train", "val", "test")})
        assert all(0.0 <= values[s] <= 1.0 for s in ("train", "val", "test"))


def test_synthetic_parts_trains_an_epoch_and_reports_f1_miou_and_accuracy(tmp_path, capsys):
    metrics = _train("synthetic_parts", tmp_path / "run", "data.options.num_shapes=6",
                     "data.options.num_points=128")
    assert metrics["metric"] == "macro_f1" and set(metrics["report"]) == {"accuracy", "miou"}
    _check_reported(metrics)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "run")]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["test"] == pytest.approx(metrics["test"])
    for name, values in metrics["report"].items():
        assert again["report"][name] == pytest.approx(values)


def test_synthetic_rooms_trains_an_epoch_and_reports_miou_accuracy_and_f1(tmp_path):
    metrics = _train("synthetic_rooms", tmp_path / "run", "data.options.rooms_per_area=1",
                     "data.options.num_points=64", "data.options.k=4", "data.options.val_blocks=4")
    assert metrics["metric"] == "miou" and set(metrics["report"]) == {"accuracy", "macro_f1"}
    _check_reported(metrics)


def test_shapenet_part_copy_trains_an_epoch(tmp_path):
    write_shapenet_part(tmp_path / "copy")
    metrics = _train("shapenet_part", tmp_path / "run", f"data.options.root={tmp_path / 'copy'}")
    assert metrics["dataset"] == "shapenet_part"
    assert set(metrics["report"]) == {"accuracy", "miou", "instance_miou", "class_miou"}
    _check_reported(metrics)


@pytest.mark.requires("h5py")
def test_s3dis_copy_trains_an_epoch(tmp_path):
    write_s3dis(tmp_path / "copy")
    metrics = _train("s3dis", tmp_path / "run", f"data.options.root={tmp_path / 'copy'}", "data.options.k=8",
                     "data.options.val_blocks=1")
    assert metrics["metric"] == "miou" and set(metrics["report"]) == {"accuracy", "macro_f1"}
    _check_reported(metrics)


@pytest.mark.parametrize("name", ["shapenet_part", pytest.param("s3dis", marks=pytest.mark.requires("h5py"))])
def test_a_missing_copy_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, name):
    out = tmp_path / "run"
    code = main(["train", "--no-progress", "--config", name, "--set", f"out_dir={out}",
                 "--set", f"data.options.root={tmp_path / 'nope'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and f"No {'S3DIS' if name == 's3dis' else 'ShapeNet-Part'} copy" in err
    assert len(err.splitlines()) == 1 and not out.exists()
    assert main(["data", "info", name, "--root", str(tmp_path / "nope")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_reported_metrics_are_checked():
    with pytest.raises(ValueError, match=r"'task\.report' must be one of"):
        validate_config(load_config("synthetic_parts", ["task.report=[accuracy, nope]"]))
