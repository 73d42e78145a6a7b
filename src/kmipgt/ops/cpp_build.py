"""Build one C++ source into a shared library with the system compiler and load it with :mod:`ctypes`.

The CPU kernels (``search/csrc/fused_topk.cpp``, ``csrc/kmip_attention.cpp``) are plain C++ with a C ABI
and no torch headers, compiled with ``-O3 -march=native -fopenmp`` in a few seconds into a per-user cache
and handed tensor pointers. That needs no ninja, no torch headers and no Python-version-specific build,
unlike ``torch.utils.cpp_extension``. Where no compiler works, the loader warns and returns ``None`` so
each caller can fall back to its torch path.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path

__all__ = ["CPP_FLAGS", "compiled_library", "cpu_signature", "find_compiler"]

CPP_FLAGS = ("-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17")


def cpu_signature() -> str:
    """The CPU's feature flags: ``-march=native`` code must not be reused on another CPU sharing the cache."""
    try:
        flags = [line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")]
        return flags[0] if flags else platform.processor()
    except OSError:
        return platform.processor()


def find_compiler() -> str | None:
    """``$CXX``, else the first of ``c++``, ``g++``, ``clang++`` on the PATH; ``None`` if there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _build(compiler: str, flags: Sequence[str], source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build to a private name and rename: concurrent first uses never load a half-written library.
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        result = subprocess.run(
            [compiler, *flags, str(source), "-o", str(partial)], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{result.stderr.strip()[-2000:]}")
        os.replace(partial, target)


def compiled_library(
    source: Path, *, compiler: str | None, flags: Sequence[str], directory: Path, purpose: str, fallback: str
) -> ctypes.CDLL | None:
    """``source`` built with ``compiler`` and ``flags`` into ``directory`` (once) and loaded.

    The library is named after the source and a digest of the source text, flags, compiler and
    :func:`cpu_signature`, so an edit, a flag or another CPU builds anew. Where ``compiler`` is ``None`` or
    the build or load fails, warns ``"kmipgt: ... {purpose} ...; {fallback}"`` and returns ``None``; callers
    cache the result, so the warning comes once per process.
    """
    if compiler is None:
        warnings.warn(
            f"kmipgt: no C++ compiler found (set $CXX), so {purpose} is unavailable; {fallback}",
            RuntimeWarning,
            stacklevel=4,
        )
        return None
    parts = [source.read_bytes(), " ".join(flags).encode(), compiler.encode(), cpu_signature().encode()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    target = directory / f"{source.stem}-{digest}.so"
    try:
        if not target.exists():
            _build(compiler, flags, source, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as error:
        message = f"kmipgt: could not build {purpose} ({error}); {fallback}"
        warnings.warn(message, RuntimeWarning, stacklevel=4)
        return None
