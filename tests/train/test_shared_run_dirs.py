"""A run in a shared folder touches only its own files; `kmipgt eval --save-tokens` writes into RUN_DIR, not
wherever the run's config points."""

import json

import torch
import yaml

from kmipgt.cli import main
from tiny_runs import TINY_DIGITS

TINY = [*TINY_DIGITS, "--set", "optim.epochs=1"]


def _train(out, *extra):
    return main(["train", "--no-progress", *TINY, "--set", f"out_dir={out}", *extra])


def _listing(folder):
    return {str(path.relative_to(folder)): path.lstat().st_mtime_ns for path in sorted(folder.rglob("*"))}


def test_a_fresh_run_deletes_only_its_own_temporary_files(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / ".notes.tmp").write_text("someone else's")
    (shared / ".x.tmp").mkdir()
    (shared / ".x.tmp" / "inside").write_text("someone else's")
    (shared / ".last.pt.k3j2.tmp").write_bytes(b"half a checkpoint")  # a killed run's own leftover
    others = _listing(shared)
    del others[".last.pt.k3j2.tmp"]
    assert _train(shared) == 0
    after = _listing(shared)
    assert {name: after.get(name) for name in others} == others
    assert ".last.pt.k3j2.tmp" not in after and (shared / "metrics.json").is_file()


def test_overwrite_removes_a_symlink_not_what_it_points_to(tmp_path):
    out, victim = tmp_path / "run", tmp_path / "victim"
    assert _train(out) == 0
    victim.mkdir()
    (victim / "kept").write_text("someone else's")
    (out / "tensorboard").symlink_to(victim, target_is_directory=True)
    assert _train(out, "--overwrite") == 0
    assert (victim / "kept").read_text() == "someone else's"
    assert not (out / "tensorboard").exists()


def test_eval_saves_tokens_into_the_run_folder_whatever_its_config_names(tmp_path, capsys):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere" / "deep"
    assert _train(out) == 0
    # A shared run whose config.yaml points out_dir somewhere else.
    config = yaml.safe_load((out / "config.yaml").read_text())
    (out / "config.yaml").write_text(yaml.safe_dump({**config, "out_dir": str(elsewhere)}))
    capsys.readouterr()
    assert main(["eval", str(out), "--save-tokens"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] == str(out / "tokens.pt")
    assert torch.load(out / "tokens.pt")["query"].dim() == 3
    assert not (tmp_path / "elsewhere").exists()
    assert main(["eval", str(out), "--tokens-out", str(tmp_path / "missing" / "tokens.pt")]) == 2
    err = capsys.readouterr().err
    assert err == f"kmipgt: error: --tokens-out: no folder {tmp_path / 'missing'}\n"
