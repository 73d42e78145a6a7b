import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_examples_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README must show the Python API"
    namespace: dict = {}  # later blocks continue the first one's session, as a reader would
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
