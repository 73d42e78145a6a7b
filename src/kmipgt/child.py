"""Child Python processes that run this copy of kmipgt and import nothing from their working folder.

``python -m kmipgt`` puts the working folder first on ``sys.path``, so a ``yaml.py`` beside a sweep file
would be imported by every cell it starts. Children therefore start isolated (``-I``: no working folder,
no user site-packages, no ``PYTHON*`` variables; it works on Python 3.10, where ``-P`` does not exist),
put the folder that holds this ``kmipgt`` on the path themselves, and get this process's environment
passed explicitly.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import kmipgt

__all__ = ["python_module_command", "run_python_module", "start_python_module"]

# What `python -m MODULE ARGS` does, after putting kmipgt's folder (argv[1]) on the path unless the
# interpreter finds it already (an installed kmipgt): the same copy runs in the child, installed or not.
_BOOTSTRAP = (
    "import runpy, sys; root = sys.argv.pop(1); module = sys.argv.pop(1); "
    "root in sys.path or sys.path.insert(0, root); "
    "runpy.run_module(module, run_name='__main__', alter_sys=True)"
)


def python_module_command(module: str, args: list[str]) -> list[str]:
    """The command line that runs ``python -m module *args`` in an isolated child on this copy of kmipgt."""
    root = str(Path(kmipgt.__file__).resolve().parents[1])
    return [sys.executable, "-I", "-c", _BOOTSTRAP, root, module, *args]


def run_python_module(module: str, args: list[str], **options: Any) -> subprocess.CompletedProcess:
    """``subprocess.run`` of :func:`python_module_command` with this process's environment; ``options``
    (``capture_output``, ``text``, ``timeout``, ...) go to ``subprocess.run``."""
    return subprocess.run(python_module_command(module, args), env=dict(os.environ), **options)


def start_python_module(module: str, args: list[str], **options: Any) -> subprocess.Popen:
    """:func:`run_python_module` without waiting: the started ``subprocess.Popen``; ``options`` (``stdout``,
    ``stderr``, ``text``, ...) go to it."""
    return subprocess.Popen(python_module_command(module, args), env=dict(os.environ), **options)
