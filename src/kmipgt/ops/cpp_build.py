"""Build one C++ source into a shared library with the system compiler and load it with :mod:`ctypes`.

The CPU kernels (``search/csrc/fused_topk.cpp``, ``csrc/kmip_attention.cpp``) are plain C++ with a C ABI
and no torch headers, compiled with ``-O3 -march=native -fopenmp`` in a few seconds into a per-user cache
and handed tensor pointers. That needs no ninja, no torch headers and no Python-version-specific build,
unlike ``torch.utils.cpp_extension``. Where no compiler works, the loader warns and returns ``None`` so
each caller can fall back to its torch path.

Loading a library runs its code, and anyone can compute its name, so a library is built and loaded only
in a folder that belongs to the user and that no one else may write, checked for the folder and for the
library file (:func:`kmipgt.cache_dir.private_folder`); anywhere else it is built anew in a private
temporary folder.
"""

from __future__ import annotations

import contextlib
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

from kmipgt.cache_dir import private_folder

__all__ = ["CPP_FLAGS", "compiled_library", "cpu_signature", "find_compiler", "library_name"]

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
    # Built under a private random name, then renamed: concurrent first uses never load a half-written
    # library, and the compiler never writes through a name someone else chose.
    descriptor, partial = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(descriptor)
    try:
        result = subprocess.run(
            [compiler, *flags, str(source), "-o", partial], capture_output=True, text=True, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{result.stderr.strip()[-2000:]}")
        # Whatever mode the linker gave it, only its owner may write it, or the next load rebuilds it.
        os.chmod(partial, 0o700)
        os.replace(partial, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(partial)


def library_name(source: Path, compiler: str, flags: Sequence[str]) -> str:
    """``<source stem>-<digest>.so``: the digest covers the source text, flags, compiler and
    :func:`cpu_signature`, so an edit, a flag or another CPU builds anew."""
    parts = [source.read_bytes(), " ".join(flags).encode(), compiler.encode(), cpu_signature().encode()]
    digest = hashlib.sha256(b"\0".join(parts)).hexdigest()[:16]
    return f"{source.stem}-{digest}.so"


def compiled_library(
    source: Path, *, compiler: str | None, flags: Sequence[str], directory: Path, purpose: str, fallback: str
) -> ctypes.CDLL | None:
    """``source`` built with ``compiler`` and ``flags`` into ``directory`` (once) and loaded.

    The library is named by :func:`library_name`. Where ``directory`` or the library in it belongs to
    another user or others may write them, it is built in a private temporary folder instead (one warning
    line; :func:`kmipgt.cache_dir.private_folder`). Where ``compiler`` is ``None`` or
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
    name = library_name(source, compiler, flags)
    target = private_folder(directory, name) / name
    try:
        if not target.exists():
            _build(compiler, flags, source, target)
        return ctypes.CDLL(str(target))
    except (OSError, RuntimeError) as error:
        message = f"kmipgt: could not build {purpose} ({error}); {fallback}"
        warnings.warn(message, RuntimeWarning, stacklevel=4)
        return None
