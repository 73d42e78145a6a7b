"""Readers for files that may come from elsewhere (shared runs, dataset copies) that never run their code.

A pickle names functions for its reader to call, so loading one with the full unpickler runs whatever the
file asks. These readers resolve only what tensors, plain containers and NumPy arrays need, and refuse
anything else with :class:`RefusedFileError`: one line naming the file and what it referred to.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import codecs
import collections
import io
import pickle
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch_geometric.data import Data
from torch_geometric.data.data import BaseData

__all__ = [
    "NUMPY_ARRAY_GLOBALS",
    "NUMPY_ARRAY_SAFE_GLOBALS",
    "PLAIN_GLOBALS",
    "RefusedFileError",
    "RestrictedUnpickler",
    "load_processed_dataset",
    "load_restricted_pickle",
    "tensor_globals",
    "torch_load_safely",
]


class RefusedFileError(ValueError):
    """A file refers to something the safe readers do not load (a function or class beyond tensors and plain
    values, which a full unpickler would call); ``refused`` says what, ``hint`` is appended to the message."""

    def __init__(self, path: str | Path, refused: str, hint: str = ""):
        self.path, self.refused = Path(path), refused
        super().__init__(
            f"{path} was not loaded: it refers to {refused}, and only tensors and plain values are read from "
            f"files (anything else could run code){hint}"
        )


def _refusal(message: str) -> str:
    """What torch's weights-only unpickler refused, from its error message."""
    found = re.search(r"GLOBAL ([\w.]+)", message)
    if found:
        return f"the global {found.group(1)}"
    detail = message.partition("WeightsUnpickler error:")[2].strip().splitlines()
    return "content the weights-only unpickler does not read" + (f" ({detail[0].strip()})" if detail else "")


def torch_load_safely(
    source: str | Path | IO[bytes], path: str | Path, safe_globals: Iterable[Any] = ()
) -> Any:
    """``torch.load(source, map_location="cpu", weights_only=True)``, also allowing ``safe_globals``.

    ``path`` names the file in errors (``source`` may be an in-memory buffer). A file the weights-only
    unpickler refuses raises :class:`RefusedFileError`; other failures (a truncated or foreign file) are
    torch's own errors.
    """
    # Leaving torch's context removes its globals from the registry: those registered before (PyG's Data)
    # must not be named, or they would be gone for every later load.
    registered = torch.serialization.get_safe_globals()
    added = [entry for entry in safe_globals if entry not in registered]
    try:
        with warnings.catch_warnings():
            # torch warns about the protocol of a plain pickle just before it refuses it.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            with torch.serialization.safe_globals(added):
                return torch.load(source, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" not in str(error):
            raise
        raise RefusedFileError(path, _refusal(str(error))) from None


class RestrictedUnpickler(pickle.Unpickler):
    """``pickle.Unpickler`` that resolves only the globals of ``allowed`` (``{(module, name): object}``);
    any other global, and any persistent id, raises :class:`RefusedFileError` naming ``path``."""

    def __init__(self, file: IO[bytes], path: str | Path, allowed: Mapping[tuple[str, str], Any]):
        super().__init__(file)
        self._path, self._allowed = path, allowed

    def find_class(self, module: str, name: str) -> Any:
        # Protocol 0-2 pickles name Python 2's modules (`__builtin__.set`); pickle maps them the same way.
        module, name = _compat_pickle.NAME_MAPPING.get(
            (module, name), (_compat_pickle.IMPORT_MAPPING.get(module, module), name)
        )
        if (module, name) not in self._allowed:
            raise RefusedFileError(self._path, f"the global {module}.{name}")
        return self._allowed[(module, name)]

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedFileError(self._path, "a persistent id (an object stored outside the pickle)")


# Built-in containers and ints (other plain values have opcodes of their own); `_codecs.encode` rebuilds
# `bytes` in protocol-2 pickles.
PLAIN_GLOBALS: dict[tuple[str, str], Any] = {
    **{("builtins", name): getattr(builtins, name) for name in ("dict", "list", "tuple", "set", "frozenset",
                                                                 "int")},
    ("_codecs", "encode"): codecs.encode,
}

# What pickle writes for a NumPy array (protocol 5: from a buffer) or scalar; NumPy 2 moved the functions
# from numpy.core to numpy._core.
NUMPY_ARRAY_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    **{(f"{package}.{module}", name): function
       for package in ("numpy.core", "numpy._core")
       for module, name, function in (("multiarray", "_reconstruct", np.zeros(0).__reduce__()[0]),
                                      ("multiarray", "scalar", np.int64(0).__reduce__()[0]),
                                      ("numeric", "_frombuffer", np.zeros(1).__reduce_ex__(5)[0]))},
}


# NUMPY_ARRAY_GLOBALS as ``torch.serialization.safe_globals`` takes them, for arrays of booleans and numbers:
# torch's weights-only unpickler also checks the class of each object it builds, here the dtype's.
NUMPY_ARRAY_SAFE_GLOBALS: list[Any] = [
    *((function, f"{module}.{name}") for (module, name), function in NUMPY_ARRAY_GLOBALS.items()),
    *{type(np.dtype(code)) for code in "?bhilqBHILQefd"},
]


def tensor_globals(path: str | Path) -> dict[tuple[str, str], Any]:
    """What ``pickle`` (not ``torch.save``) writes for CPU tensors, each storage read by
    :func:`torch_load_safely` (torch's own ``_load_from_bytes`` uses the full unpickler); ``path`` names the
    file in errors."""

    def rebuild(storage, offset, size, stride, requires_grad, backward_hooks, metadata=None):
        # Backward hooks are functions the tensor would call: torch's weights-only unpickler refuses them too.
        if backward_hooks:
            raise RefusedFileError(path, "a tensor with backward hooks")
        return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
                                               collections.OrderedDict(), metadata)

    return {
        ("torch._utils", "_rebuild_tensor_v2"): rebuild,
        ("torch.storage", "_load_from_bytes"): lambda data: torch_load_safely(io.BytesIO(data), path),
        ("collections", "OrderedDict"): collections.OrderedDict,
    }


def load_restricted_pickle(path: str | Path, allowed: Mapping[tuple[str, str], Any]) -> Any:
    """The object pickled in the file at ``path``, unpickled by :class:`RestrictedUnpickler` with ``allowed``.

    Raises :class:`RefusedFileError` for any other global; ValueError naming the file when it is no readable
    pickle (truncated, or the allowed functions reject their arguments).
    """
    try:
        with open(path, "rb") as handle:
            return RestrictedUnpickler(handle, path, allowed).load()
    except RefusedFileError:
        raise
    # Bytes that are no pickle fail in the unpickler with whatever error they trigger.
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a readable pickle ({reason})") from None


def load_processed_dataset(
    path: str | Path, data_class: type[BaseData] = Data
) -> tuple[BaseData, dict[str, Any] | None]:
    """The collated graph and slices of a PyG ``InMemoryDataset`` file, read weights-only.

    Reads what ``InMemoryDataset.save`` writes (``(data_dict, slices, data_class)``) and PyG's two earlier
    forms (``(data_dict_or_data, slices)``, read as ``data_class``); the stored class must be one PyG allows
    the weights-only unpickler (``Data``, ``HeteroData``, ...). Unlike PyG's own loader, a refused file is
    never read again with the full unpickler: it raises :class:`RefusedFileError`; another form raises
    ValueError.
    """
    stored = torch_load_safely(path, path)
    if not (isinstance(stored, tuple) and len(stored) in (2, 3)):
        raise ValueError(f"{path} is not a PyG processed dataset (expected a tuple (data, slices[, class]))")
    data, slices, data_class = (*stored, data_class) if len(stored) == 2 else stored
    if not (isinstance(data_class, type) and issubclass(data_class, BaseData)):
        raise ValueError(f"{path} is not a PyG processed dataset (its data class is {data_class!r})")
    if isinstance(data, dict):
        data = data_class.from_dict(data)
    if not isinstance(data, BaseData):
        raise ValueError(f"{path} is not a PyG processed dataset (it holds a {type(data).__name__})")
    return data, slices
