import functools
import os
import re
from pathlib import Path

import torch

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README must show the Python API"
    # The README's torch.compile traces the model as inductor would (aot_eager: the same graph, forward and
    # backward), without inductor's code generation, which takes a minute on a CI machine.
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    monkeypatch.chdir(tmp_path)  # files it writes (model.pt2) land there
    namespace: dict = {}  # later blocks continue the first one's session, as a reader would
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    assert os.path.isfile("model.pt2")
