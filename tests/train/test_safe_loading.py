"""A run directory from elsewhere never runs code: checkpoints load weights-only in every command and in the
Python API; the last.pt of kmipgt 0.1.0 (NumPy arrays) loads only through --trust-checkpoint, which reads
NumPy arrays too and still nothing else (docs/reliability.md)."""

import json
import random
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from kmipgt.cli import main
from kmipgt.train import evaluate_run, load_config, load_run, train
from kmipgt.train.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from payloads import PAYLOADS, ShellPayload

BASE = ["--set", "data.name=digits_knn", "--set", "model.num_layers=1", "--set", "model.channels=8",
        "--set", "model.attention.k=4", "--set", "device=cpu", "--set", "threads=1",
        "--set", "optim.epochs=2", "--set", "optim.eval_every=1"]


def _train_argv(out, *extra):
    return ["train", "--no-progress", *BASE, "--set", f"out_dir={out}", *extra]


@pytest.fixture(scope="module")
def half_run(tmp_path_factory):
    """Epoch 1 of 2 of a tiny digits_knn run: config.yaml, best.pt and last.pt (shared: tests copy it)."""
    out = tmp_path_factory.mktemp("safe") / "run"
    threads = torch.get_num_threads()
    assert main(_train_argv(out, "--stop-after", "1")) == 0
    torch.set_num_threads(threads)
    return out


@pytest.fixture
def run(half_run, tmp_path):
    """A private copy of :func:`half_run`, its ``out_dir`` moved with it (so that it resumes there)."""
    copy = Path(shutil.copytree(half_run, tmp_path / "run"))
    config = yaml.safe_load((copy / "config.yaml").read_text())
    config["out_dir"] = str(copy)
    (copy / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    last = torch.load(copy / "last.pt", weights_only=True)
    last["config"]["out_dir"] = str(copy)
    torch.save(last, copy / "last.pt")
    return copy


def _files(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kmipgt: error: "), err
    return err[0]


def _plant(run: Path, payload, marker: Path) -> None:
    """Replace both checkpoints with pickles whose loading would create ``marker``."""
    for name in ("best.pt", "last.pt"):
        torch.save({"model": payload(marker), "epoch": 1}, run / name)


COMMANDS = {
    "eval": lambda run: ["eval", str(run)],
    "eval last": lambda run: ["eval", str(run), "--checkpoint", "last"],
    "explain": lambda run: ["analysis", "explain", str(run), "--no-progress"],
    "bench approx": lambda run: ["bench", "approx", str(run), "--no-progress"],
    "resume": lambda run: _train_argv(run, "--resume"),
}


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("command", COMMANDS)
def test_a_checkpoint_that_would_run_code_is_refused_by_every_command(run, tmp_path, capsys, payload,
                                                                      command):
    marker = tmp_path / "marker"
    _plant(run, payload, marker)
    before = _files(run)
    capsys.readouterr()
    assert main(COMMANDS[command](run)) == 2
    line = _error_line(capsys)
    name = "last.pt" if command in ("eval last", "resume") else "best.pt"
    assert f"{run / name} was not loaded: it refers to the global " in line
    assert "--trust-checkpoint" not in line  # the opt-in is for kmipgt 0.1.0's NumPy arrays, never for this
    assert not marker.exists()
    assert _files(run) == before  # nothing written, not even the explain/ or approx/ folder


def test_the_python_api_refuses_a_checkpoint_that_would_run_code(run, tmp_path):
    marker = tmp_path / "marker"
    _plant(run, ShellPayload, marker)
    before = _files(run)
    for call in (lambda: load_run(run), lambda: load_run(run, "last"), lambda: evaluate_run(run),
                 lambda: train(load_config(run / "config.yaml"), resume=True),
                 lambda: load_checkpoint(run / "best.pt")):
        with pytest.raises(ValueError, match=r"was not loaded: it refers to the global \S*system"):
            call()
    assert not marker.exists()
    assert _files(run) == before


@pytest.mark.parametrize("command", ["eval last", "resume"])
def test_the_opt_in_still_refuses_code_behind_numpy_arrays(run, tmp_path, capsys, command):
    marker = tmp_path / "marker"
    content = torch.load(run / "last.pt", weights_only=True)
    content["rng"]["numpy"] = np.zeros(624, dtype=np.uint32)
    content["state"]["payload"] = ShellPayload(marker)  # after the array in the pickle
    torch.save(content, run / "last.pt")
    before = _files(run)
    capsys.readouterr()
    assert main([*COMMANDS[command](run), "--trust-checkpoint"]) == 2
    assert re.search(r"refers to the global \S*\.system", _error_line(capsys))
    assert not marker.exists()
    assert _files(run) == before


def test_a_run_writes_checkpoints_the_weights_only_loader_reads(half_run):
    for name in ("best.pt", "last.pt"):
        torch.load(half_run / name, map_location="cpu", weights_only=True)


def test_rng_states_survive_a_checkpoint(tmp_path):
    generator = torch.Generator().manual_seed(3)
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    np.random.standard_normal()  # leaves a cached Gaussian in NumPy's state
    save_checkpoint(tmp_path / "last.pt", model={}, rng=rng_state(generator))

    def draw():
        loader = torch.rand(2, generator=generator)
        return random.random(), np.random.standard_normal(2), torch.rand(2), loader

    expected = draw()
    random.seed(0), np.random.seed(0), torch.manual_seed(0), generator.manual_seed(0)
    set_rng_state(load_checkpoint(tmp_path / "last.pt", keys=("rng",))["rng"], generator)
    drawn = draw()
    assert drawn[0] == expected[0]
    np.testing.assert_array_equal(drawn[1], expected[1])
    assert torch.equal(drawn[2], expected[2]) and torch.equal(drawn[3], expected[3])


def _old_format(run: Path) -> None:
    """Rewrite ``last.pt`` as kmipgt 0.1.0 wrote it: NumPy's RNG state as ``np.random.get_state()``'s tuple
    (a str, a uint32 array and numbers), which the weights-only unpickler refuses."""
    content = torch.load(run / "last.pt", weights_only=True)
    saved = content["rng"]["numpy"]
    content["rng"]["numpy"] = (saved["kind"], saved["key"].numpy().astype(np.uint32), saved["pos"],
                               saved["has_gauss"], saved["gauss"])
    torch.save(content, run / "last.pt")


def _metrics(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out[out.index("{"):])


def test_a_last_pt_of_kmipgt_0_1_0_evaluates_only_through_the_opt_in(run, tmp_path, capsys):
    assert main(["eval", str(run), "--checkpoint", "last"]) == 0
    expected = _metrics(capsys)
    _old_format(run)
    before = _files(run)
    assert main(["eval", str(run), "--checkpoint", "last"]) == 2
    line = _error_line(capsys)
    assert "refers to the global numpy" in line and "kmipgt 0.1.0" in line and "--trust-checkpoint" in line
    assert main(["eval", str(run)]) == 0  # its best.pt holds weights only: nothing to trust
    capsys.readouterr()
    assert main(["eval", str(run), "--checkpoint", "last", "--trust-checkpoint"]) == 0
    assert _metrics(capsys) == expected
    assert _files(run) == before
    with pytest.raises(ValueError, match="trust_checkpoint=True"):
        load_run(run, "last")
    weights = load_run(run, "last", trust_checkpoint=True).model.state_dict()
    for key, value in torch.load(run / "best.pt", weights_only=True)["model"].items():  # epoch 1 is both
        assert torch.equal(weights[key], value)


def test_a_last_pt_of_kmipgt_0_1_0_resumes_through_the_opt_in_and_is_rewritten(run, tmp_path, capsys):
    untouched = Path(shutil.copytree(run, tmp_path / "untouched"))
    assert main(_train_argv(run, "--resume")) == 0  # the reference: resumed from the current form
    expected = torch.load(run / "last.pt", weights_only=True)
    shutil.rmtree(run)
    untouched.rename(run)
    _old_format(run)
    capsys.readouterr()
    assert main(_train_argv(run, "--resume")) == 2
    assert "--trust-checkpoint" in _error_line(capsys)
    assert main(_train_argv(run, "--resume", "--trust-checkpoint")) == 0
    resumed = torch.load(run / "last.pt", weights_only=True)  # rewritten in the current form
    assert resumed["state"]["epoch"] == 2
    for key, value in expected["model"].items():  # the RNG states carried over exactly
        torch.testing.assert_close(resumed["model"][key], value, atol=0, rtol=0)


def test_trust_checkpoint_without_resume_is_a_usage_error(tmp_path, capsys):
    assert main(_train_argv(tmp_path / "new", "--trust-checkpoint")) == 2
    assert "--resume" in _error_line(capsys)
    assert not (tmp_path / "new").exists()


def test_a_config_yaml_that_would_run_code_is_refused(run, tmp_path, capsys):
    marker = tmp_path / "marker"
    config = run / "config.yaml"
    config.write_text(f"seed: !!python/object/apply:os.system ['touch {marker}']\n" + config.read_text())
    capsys.readouterr()
    assert main(["eval", str(run)]) == 2
    assert f"{config} is not valid YAML" in _error_line(capsys)
    assert not marker.exists()
