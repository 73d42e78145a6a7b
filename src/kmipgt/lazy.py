"""Objects imported when first used: ``"package.module:attribute"`` references, and packages whose public
names load with their submodule.

The registries of datasets and of attention kinds name their built-in entries this way, as packaging entry
points do, so that listing or checking names (a config's ``data.name``, ``model.attention``) imports no
torch.

A lazy package lists its public names once, in the stub ``__init__.pyi`` beside its ``__init__.py``, as
Scientific Python's SPEC 1 does: type checkers read the stub's imports as the package's re-exports, and
:func:`lazy_package` reads them as the table of which submodule defines each name. We read the stub ourselves
rather than with ``lazy_loader.attach_stub`` because lazy_loader before 0.6 binds a submodule over a public
name of the same name (``kmipgt.data.minnesota``), which ``_LazyPackage`` prevents without a new dependency.
"""

from __future__ import annotations

import ast
import importlib
import sys
import types
from pathlib import Path
from typing import Any

__all__ = ["lazy_package", "resolve", "stub_sources"]


def resolve(target: Any) -> Any:
    """``target`` itself, or the object a ``"package.module:attribute"`` string names, imported now."""
    if not isinstance(target, str):
        return target
    module, sep, attribute = target.partition(":")
    if not sep or not module or not attribute:
        raise ValueError(f"expected a 'package.module:attribute' reference, got {target!r}")
    return getattr(importlib.import_module(module), attribute)


class _LazyPackage(types.ModuleType):
    """A package whose public names are imported with their submodule on first access.

    As a module ``__getattr__`` (PEP 562) would, plus one rule it cannot express: the import system binds
    every loaded submodule on its package, and where a public name is also a submodule's name
    (``kmipgt.data.minnesota``, the loader function) the name keeps meaning the public object.
    """

    def __getattr__(self, name: str) -> Any:
        sources = self.__dict__["_lazy_sources"]
        if name not in sources:
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{self.__name__}.{sources[name]}"), name)
        super().__setattr__(name, value)
        return value

    def __setattr__(self, name: str, value: Any) -> None:
        submodule = isinstance(value, types.ModuleType) and value.__name__ == f"{self.__name__}.{name}"
        if not (submodule and name in self.__dict__.get("_lazy_sources", ())):
            super().__setattr__(name, value)

    def __dir__(self) -> list[str]:
        return sorted({*self.__dict__, *self.__dict__.get("__all__", ())})


def _reexport(stub: Path, node: ast.stmt) -> tuple[str, list[str]]:
    """The submodule and names of ``from .submodule import name as name, ...``, the stub's only kind of line:
    ``as name`` makes type checkers read a name as re-exported, not as a private import of the stub."""
    if (
        isinstance(node, ast.ImportFrom)
        and node.level == 1
        and node.module
        and all(alias.asname == alias.name for alias in node.names)
    ):
        return node.module, [alias.name for alias in node.names]
    raise ValueError(f"{stub}:{node.lineno}: expected only 'from .submodule import name as name' lines")


def stub_sources(stub: Path) -> dict[str, str]:
    """Public name -> the submodule that defines it, in the order of the stub's imports."""
    sources: dict[str, str] = {}
    for node in ast.parse(stub.read_text(), filename=str(stub)).body:
        submodule, names = _reexport(stub, node)
        for name in names:
            if name in sources:
                raise ValueError(f"{stub}:{node.lineno}: {name!r} is imported twice")
            sources[name] = submodule
    return sources


def lazy_package(package: str, init_file: str) -> None:
    """Make ``package`` (its ``__init__`` calls this with ``__name__, __file__``) import each public name of
    its stub ``__init__.pyi`` from the submodule the stub names, on first access, so that the package loads
    without its submodules' dependencies (torch) and its torch-free submodules stay cheap."""
    sources = stub_sources(Path(init_file).with_suffix(".pyi"))
    module = sys.modules[package]
    vars(module).update(__all__=list(sources), _lazy_sources=sources)
    module.__class__ = _LazyPackage
