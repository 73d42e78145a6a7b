"""Every file kmipgt writes goes through :mod:`kmipgt.atomic`: written whole or not at all, and a symlink
where the file goes is replaced, never written through."""

import ast
import json
import os
import re
import signal
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import torch

import kmipgt
from kmipgt.atomic import (
    atomic_write,
    atomic_write_json,
    atomic_write_text,
    save_array,
    save_figure,
    save_named_arrays,
    save_tensors,
)

matplotlib.use("Agg")
import matplotlib.pyplot as plt

PACKAGE = Path(kmipgt.__file__).parent

# Calls that write a file by its name, following a symlink there; only kmipgt/atomic.py may make them.
WRITING_METHODS = {"write_text", "write_bytes", "savefig"}
WRITING_FUNCTIONS = {"np.save", "np.savez", "np.savez_compressed", "np.savetxt", "numpy.save", "torch.save"}
# open(path, "w"), Path.open("ab"), open(path, mode="x"), ...: any mode that writes.
WRITING_MODE = re.compile(r"[wax+]")


def _mode(call: ast.Call) -> ast.expr | None:
    """The mode argument of an ``open`` call: ``open(path, mode)``, ``path.open(mode)`` or ``mode=``."""
    keyword = next((k.value for k in call.keywords if k.arg == "mode"), None)
    position = 0 if isinstance(call.func, ast.Attribute) else 1
    return keyword or (call.args[position] if len(call.args) > position else None)


def _writers(source: str) -> list[str]:
    """The calls in ``source`` that write a file (``open(os.devnull, "w")`` aside: no one owns it)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = ast.unparse(node.func)
        method = node.func.attr if isinstance(node.func, ast.Attribute) else name
        if method == "open":
            mode = _mode(node)
            writes = isinstance(mode, ast.Constant) and WRITING_MODE.search(str(mode.value))
            if writes and not (node.args and ast.unparse(node.args[0]) == "os.devnull"):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        elif method in WRITING_METHODS or name in WRITING_FUNCTIONS:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_the_finder_finds_every_kind_of_writer():
    source = "\n".join([
        'open(path, "w")', "open(path, 'wb')", 'path.open("a")', 'open(p, mode="x")', 'p.write_text("x")',
        "p.write_bytes(b)", "fig.savefig(path, dpi=90)", "np.save(p, a)", "np.savez(p, **a)",
        "torch.save(obj, path)",
    ])
    assert len(_writers(source)) == 10
    assert not _writers('open(path)\nopen(path, "rb")\nopen(p, encoding="ascii")\nx = "torch.save(x)"\n'
                        '# fig.savefig(path)\nsys.stdout = open(os.devnull, "w")')


def test_nothing_in_the_package_writes_a_file_but_the_atomic_module():
    found = {
        str(path.relative_to(PACKAGE)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "atomic.py" and (lines := _writers(path.read_text()))
    }
    assert not found


def _victim_and_link(tmp_path: Path, name: str) -> tuple[Path, Path]:
    victim = tmp_path / "elsewhere" / "victim"
    victim.parent.mkdir()
    victim.write_text("someone else's file")
    link = tmp_path / "out" / name
    link.parent.mkdir()
    link.symlink_to(victim)
    return victim, link


@pytest.mark.parametrize(("name", "write", "read"), [
    ("report.md", lambda p: atomic_write_text(p, "report"), lambda p: p.read_text()),
    ("metrics.json", lambda p: atomic_write_json(p, {"ap": 0.5}), lambda p: json.loads(p.read_text())),
    ("tokens.pt", lambda p: save_tensors({"q": torch.ones(2)}, p), lambda p: torch.load(p)["q"].tolist()),
    ("labels.npy", lambda p: save_array(p, np.arange(3)), lambda p: np.load(p).tolist()),
    ("graph.npz", lambda p: save_named_arrays(p, {"a": np.ones(2)}), lambda p: np.load(p)["a"].tolist()),
    ("plot.png", lambda p: save_figure(plt.figure(), p, dpi=10), lambda p: p.read_bytes()[:4]),
])
def test_a_symlink_at_the_target_is_replaced_and_its_target_left_alone(tmp_path, name, write, read):
    victim, link = _victim_and_link(tmp_path, name)
    write(link)
    assert victim.read_text() == "someone else's file"
    assert not link.is_symlink() and link.is_file()
    assert read(link) == {"report.md": "report", "metrics.json": {"ap": 0.5}, "tokens.pt": [1.0, 1.0],
                          "labels.npy": [0, 1, 2], "graph.npz": [1.0, 1.0], "plot.png": b"\x89PNG"}[name]
    assert sorted(os.listdir(link.parent)) == [name]  # no temporary file left
    assert link.stat().st_mode & 0o077 == 0  # readable by its owner only, like every file written


class _InterruptedFile:
    """A file whose first write receives Ctrl-C (SIGINT) before it goes on."""

    def __init__(self, handle):
        self.handle, self.interrupted = handle, False

    def write(self, data: bytes) -> int:
        if not self.interrupted:
            self.interrupted = True
            os.kill(os.getpid(), signal.SIGINT)
        return self.handle.write(data)

    def flush(self) -> None:
        self.handle.flush()


def test_a_ctrl_c_during_a_checkpoint_write_waits_until_the_file_is_whole(tmp_path):
    """Ctrl-C inside torch.save's writer would leave its zip half-written (and its C++ cleanup's error can
    hide the interrupt); the interrupt comes once the file is written and in place."""
    tensors = {"weights": torch.arange(100_000.0)}
    # Python's own handler, as in a terminal: a process started in the background (a CI job, say) ignores
    # SIGINT, and then so would this test.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            atomic_write(tmp_path / "last.pt", lambda handle: torch.save(tensors, _InterruptedFile(handle)))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert torch.equal(torch.load(tmp_path / "last.pt")["weights"], tensors["weights"])
    assert [path.name for path in tmp_path.iterdir()] == ["last.pt"]
