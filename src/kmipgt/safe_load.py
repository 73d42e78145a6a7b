"""Readers for files that may come from elsewhere (shared runs, dataset copies) that never run their code.

A pickle names functions for its reader to call, so loading one with the full unpickler runs whatever the
file asks. These readers resolve only what tensors, plain containers and NumPy arrays need, and refuse
anything else with :class:`RefusedFileError`: one line naming the file and what it referred to.

A file can also ask for memory: a small compressed member that unpacks to gigabytes, a storage declared
larger than the file, a tensor reaching past its storage (torch would grow the storage with uninitialised
memory). Before torch reads a file, its pickle is read once more with placeholders for every object
(:class:`_StorageAudit`, which builds and calls nothing), and such files are refused with
:class:`UnsafeFileError`. Each file is read into memory once, so what is checked is what torch reads.
"""

from __future__ import annotations

import _compat_pickle
import builtins
import codecs
import collections
import io
import pickle
import re
import reprlib
import warnings
import zipfile
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
    "UnsafeFileError",
    "load_processed_dataset",
    "load_restricted_pickle",
    "tensor_globals",
    "torch_load_safely",
]


class UnsafeFileError(ValueError):
    """A file the safe readers do not load, with one line naming it and ``reason``."""

    def __init__(self, path: str | Path, reason: str):
        self.path = Path(path)
        super().__init__(f"{path} was not loaded: {reason}")


class RefusedFileError(UnsafeFileError):
    """A file refers to something the safe readers do not load (a function or class beyond tensors and plain
    values, which a full unpickler would call); ``refused`` says what, ``hint`` is appended to the message."""

    def __init__(self, path: str | Path, refused: str, hint: str = ""):
        self.refused = refused
        super().__init__(
            path, f"it refers to {refused}, and only tensors and plain values are read from files (anything "
            f"else could run code){hint}"
        )


# What a zip archive, torch's file format since 1.6, starts with (torch tells the formats apart by it too).
_ZIP_MAGIC = b"PK\x03\x04"


def _refusal(message: str) -> str:
    """What torch's weights-only unpickler refused, from its error message."""
    found = re.search(r"GLOBAL ([\w.]+)", message)
    if found:
        return f"the global {found.group(1)}"
    detail = message.partition("WeightsUnpickler error:")[2].strip().splitlines()
    return "content the weights-only unpickler does not read" + (f" ({detail[0].strip()})" if detail else "")


class _Placeholder:
    """Stands for every object of a pickle while :class:`_StorageAudit` reads it: built from any arguments,
    it takes any state or item and does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Placeholder:
        return _Placeholder()

    def __setstate__(self, state: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def append(self, value: Any) -> None:
        pass

    def extend(self, values: Any) -> None:
        pass


class _Declared:
    """A storage as a pickle declares it: bytes and the size of one element."""

    def __init__(self, nbytes: int, element_size: int) -> None:
        self.nbytes, self.element_size = nbytes, element_size


def _check_extent(path: str | Path, elements: int, offset: Any, size: Any, stride: Any) -> None:
    """UnsafeFileError unless a tensor of ``size`` and ``stride`` from ``offset`` stays in ``elements``."""
    try:
        start, shape, steps = int(offset), [int(n) for n in size], [int(n) for n in stride]
    except (TypeError, ValueError):
        raise UnsafeFileError(path, "a tensor's offset, size or stride is not a list of integers") from None
    if len(shape) != len(steps) or min([start, *shape, *steps]) < 0:
        raise UnsafeFileError(path, f"a tensor has size {shape}, stride {steps} and offset {start}")
    end = 0 if 0 in shape else start + 1 + sum((n - 1) * step for n, step in zip(shape, steps))
    if end > elements:
        raise UnsafeFileError(path, f"a tensor reaches element {end} of a storage of {elements} elements")


# The dtype of each storage class and each dtype, by the names torch's weights-only unpickler allows.
_TORCH_DTYPES: dict[str, torch.dtype] = {
    "UntypedStorage": torch.uint8,
    **{name: dtype for dtype, name in torch.storage._dtype_to_storage_type_map().items()},
    **{str(value).removeprefix("torch."): value for value in vars(torch).values()
       if isinstance(value, torch.dtype)},
}

# torch's rebuild functions whose first four arguments are a storage, an offset, a size and a stride.
_DENSE_REBUILDS = ("_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_tensor_v3", "_rebuild_qtensor")


class _StorageAudit(pickle.Unpickler):
    """Reads a torch file's pickle without building or calling anything: the storages it declares count
    against ``limit`` bytes, and each dense tensor must stay within its storage; every other object is a
    :class:`_Placeholder`."""

    def __init__(self, file: IO[bytes], path: str | Path, limit: int) -> None:
        super().__init__(file)
        self._path, self._limit, self._storages = path, limit, {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch._utils" and name in _DENSE_REBUILDS:
            return self._rebuild
        if (module, name) == ("torch._tensor", "_rebuild_from_type_v2"):
            return lambda rebuild, new_type, args, state: rebuild(*args)
        if module == "torch" and name in _TORCH_DTYPES:
            return _TORCH_DTYPES[name]
        return _Placeholder

    def persistent_load(self, pid: Any) -> _Declared:
        # ("storage", storage type, key, location, elements[, view]), as torch.save writes it.
        if not (isinstance(pid, tuple) and len(pid) >= 5 and isinstance(pid[1], torch.dtype)
                and isinstance(pid[4], int) and pid[4] >= 0):
            raise UnsafeFileError(self._path, f"it refers to a storage as {reprlib.repr(pid)}")
        declared = _Declared(pid[4] * pid[1].itemsize, pid[1].itemsize)
        self._storages.setdefault(pid[2], declared.nbytes)
        total = sum(self._storages.values())
        if total > self._limit:
            raise UnsafeFileError(self._path, f"its storages take {total} bytes, more than the {self._limit} "
                                              "it holds (a file torch.save wrote holds all of its storages)")
        return declared

    def _rebuild(self, storage: Any, offset: Any, size: Any, stride: Any, *rest: Any) -> _Placeholder:
        if not isinstance(storage, _Declared):
            raise UnsafeFileError(self._path, "a tensor has no storage of the file")
        # _rebuild_tensor_v3 names the tensor's dtype over an untyped storage; the others take the storage's.
        dtype = rest[2] if len(rest) >= 3 and isinstance(rest[2], torch.dtype) else None
        element_size = dtype.itemsize if dtype is not None else storage.element_size
        _check_extent(self._path, storage.nbytes // element_size, offset, size, stride)
        return _Placeholder()


def _check_storages(content: bytes, path: str | Path, limit: int) -> None:
    """UnsafeFileError where the torch file ``content`` has a compressed member, declares more than ``limit``
    bytes of storage or a tensor beyond its storage (see :class:`_StorageAudit`)."""
    if content.startswith(_ZIP_MAGIC):
        archive = zipfile.ZipFile(io.BytesIO(content))  # a truncated archive fails here as it would in torch
        members = archive.infolist()
        names = [member.filename for member in members]
        for member in members:
            if member.compress_type != zipfile.ZIP_STORED:
                raise UnsafeFileError(path, f"its member {member.filename} is compressed, and a small "
                                            "compressed member can unpack to any size")
            if names.count(member.filename) > 1:
                raise UnsafeFileError(path, f"it holds {member.filename} twice")
        pickled = f"{names[0].split('/')[0]}/data.pkl" if names else ""
        if pickled in names:  # else torch refuses the file before it reads a storage
            _audit(archive.read(pickled), path, limit, pickles=1)
        return
    # The legacy format: a magic number, a protocol and system facts, then the pickle with the storages.
    _audit(content, path, limit, pickles=4)


def _audit(pickled: bytes, path: str | Path, limit: int, pickles: int) -> None:
    """Read the first ``pickles`` pickles of ``pickled`` with :class:`_StorageAudit`; a legacy file
    (``pickles=4``) whose first is not torch's magic number is left to torch, which refuses it. Bytes that
    are no pickle fail here as they would in torch (a truncated file)."""
    audit = _StorageAudit(io.BytesIO(pickled), path, limit)
    for index in range(pickles):
        if audit.load() != torch.serialization.MAGIC_NUMBER and index == 0 and pickles > 1:
            return


def torch_load_safely(
    source: str | Path | IO[bytes],
    path: str | Path,
    safe_globals: Iterable[Any] = (),
    *,
    max_bytes: int | None = None,
) -> Any:
    """``torch.load(source, map_location="cpu", weights_only=True)``, also allowing ``safe_globals``.

    ``path`` names the file in errors (``source`` may be an in-memory buffer, read from where it stands).
    The file is read into memory once and checked first: compressed zip members, storages of more than
    ``max_bytes`` in all (default: the file's size, which holds every storage of a file ``torch.save``
    wrote; pass more for a file known to declare more) and tensors that reach past their storage raise
    :class:`UnsafeFileError`. A file the weights-only unpickler refuses raises :class:`RefusedFileError`;
    other failures (a truncated or foreign file) are the errors of torch, ``zipfile`` or ``pickle``.
    """
    content = Path(source).read_bytes() if isinstance(source, (str, Path)) else source.read()
    _check_storages(content, path, len(content) if max_bytes is None else max_bytes)
    # Leaving torch's context removes its globals from the registry: those registered before (PyG's Data)
    # must not be named, or they would be gone for every later load.
    registered = torch.serialization.get_safe_globals()
    added = [entry for entry in safe_globals if entry not in registered]
    try:
        with warnings.catch_warnings():
            # torch warns about the protocol of a plain pickle just before it refuses it.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            with torch.serialization.safe_globals(added):
                return torch.load(io.BytesIO(content), map_location="cpu", weights_only=True)
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
        if not isinstance(storage, torch.storage.TypedStorage):
            raise UnsafeFileError(path, f"a tensor's storage is a {type(storage).__name__}")
        _check_extent(path, storage._size(), offset, size, stride)
        return torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
                                               collections.OrderedDict(), metadata)

    return {
        ("torch._utils", "_rebuild_tensor_v2"): rebuild,
        ("torch.storage", "_load_from_bytes"): lambda data: torch_load_safely(io.BytesIO(data), path),
        ("collections", "OrderedDict"): collections.OrderedDict,
    }


def load_restricted_pickle(path: str | Path, allowed: Mapping[tuple[str, str], Any]) -> Any:
    """The object pickled in the file at ``path``, unpickled by :class:`RestrictedUnpickler` with ``allowed``.

    Raises :class:`RefusedFileError` for any other global, :class:`UnsafeFileError` for a tensor beyond its
    storage; ValueError naming the file when it is no readable pickle (truncated, or the allowed functions
    reject their arguments).
    """
    try:
        with open(path, "rb") as handle:
            return RestrictedUnpickler(handle, path, allowed).load()
    except UnsafeFileError:
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
