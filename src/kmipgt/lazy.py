"""Objects imported when first used: ``"package.module:attribute"`` references, and packages whose public
names load with their submodule.

The registries of datasets and of attention kinds name their built-in entries this way, as packaging entry
points do, so that listing or checking names (a config's ``data.name``, ``model.attention``) imports no
torch.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

__all__ = ["lazy_package", "resolve"]


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


def lazy_package(package: str, sources: dict[str, str]) -> None:
    """Make ``package`` (its ``__init__`` calls this with ``__name__``) import each public name from the
    submodule ``sources[name]`` on first access, so that the package loads without its submodules'
    dependencies (torch) and its torch-free submodules stay cheap."""
    module = sys.modules[package]
    module._lazy_sources = dict(sources)
    module.__class__ = _LazyPackage
