"""The registry of search backends: each backend module registers its name, search function and capabilities.

The dispatcher (:func:`kmipgt.ops.topk_inner_product`) looks backends up here by name, and ``auto`` picks
among them by their flags; backends that need an exact search of their own (the IVF indexes, for small
graphs) call :func:`auto_backend` rather than import another backend.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

__all__ = ["SearchBackend", "auto_backend", "get_backend", "importable", "register", "registered_backends"]

# ``search(query, key, k, ptr, **options)`` with validated ``[M, H, d]`` query, ``[N, H, d]`` key, ``k >= 1``
# and ``[G + 1]`` CPU graph offsets of the queries; returns ``[M, H, k]`` scores and int64 global key indices.
# Approximate backends take the options ``nlist`` and ``nprobe``. Backends flagged ``queries_differ`` also
# take ``key_ptr``, the ``[G + 1]`` offsets of the keys' graphs; the dispatcher passes it only where the
# keys' layout differs from the queries' (otherwise ``M == N`` and the graphs coincide).
SearchFunction = Callable[..., tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class SearchBackend:
    """One search backend and what it can do.

    Attributes:
        name: the ``backend=`` value that selects it.
        search: the search function (see ``SearchFunction`` above).
        exact: False where the search may miss some of the true top-k (``nlist``/``nprobe`` apply).
        available: whether its optional package or compiler is present here (may build or import lazily).
        devices: device types it runs on; ``None``: any device torch runs on.
        dtypes: floating dtypes it takes; ``None``: any.
        queries_differ: whether the keys may be laid out in graphs of their own (``key_ptr``, ``M != N``).
        max_k: the largest k it searches; ``None``: any.
        takes_layout: whether it takes the batch's :class:`~kmipgt.ops.ragged.RaggedLayout` (``layout=``)
            to reuse device tables built once per batch.
        auto_rank: order in which ``auto`` tries it (lower first); ``None``: ``auto`` never picks it.
    """

    name: str
    search: SearchFunction
    exact: bool
    available: Callable[[], bool]
    devices: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    queries_differ: bool = False
    max_k: int | None = None
    takes_layout: bool = False
    auto_rank: int | None = None

    def takes(self, device_type: str, dtype: torch.dtype, k: int = 1) -> bool:
        """Whether inputs on ``device_type`` (e.g. ``"cpu"``) with ``dtype``, searched for ``k`` keys, are
        within its flags."""
        return (
            (self.devices is None or device_type in self.devices)
            and (self.dtypes is None or dtype in self.dtypes)
            and (self.max_k is None or k <= self.max_k)
        )


def importable(module: str) -> Callable[[], bool]:
    """An ``available`` check for a backend on an optional package: whether ``module`` can be imported here
    (asked at each call; nothing is imported)."""
    return lambda: importlib.util.find_spec(module) is not None


_BACKENDS: dict[str, SearchBackend] = {}


def register(backend: SearchBackend) -> SearchBackend:
    """Add ``backend`` under its name (ValueError if taken); backends are listed in registration order."""
    if backend.name == "auto":
        raise ValueError("'auto' names the dispatcher's choice among the backends, not a backend")
    if backend.name in _BACKENDS:
        raise ValueError(f"a search backend named {backend.name!r} is already registered")
    _BACKENDS[backend.name] = backend
    return backend


def registered_backends() -> Mapping[str, SearchBackend]:
    """Read-only view ``name -> SearchBackend`` of every registered backend, in registration order."""
    return MappingProxyType(_BACKENDS)


def get_backend(name: str) -> SearchBackend:
    """The backend registered as ``name``; ValueError naming the registered backends otherwise."""
    if not isinstance(name, str) or name not in _BACKENDS:
        raise ValueError(f"`backend` must be one of {('auto', *_BACKENDS)}, got {name!r}")
    return _BACKENDS[name]


def auto_backend(
    device_type: str, dtype: torch.dtype, *, queries_differ: bool = False, k: int = 1
) -> SearchBackend:
    """The backend ``auto`` uses: the lowest ``auto_rank`` that takes the device, dtype and ``k`` and is
    available (and, with ``queries_differ``, searches keys laid out in graphs of their own).

    It decides on these host facts alone, never on tensor values, and only among backends that can serve
    the call. Availability is asked last, so a backend is only built or imported for inputs it would search.
    """
    ranked = sorted((b for b in _BACKENDS.values() if b.auto_rank is not None), key=lambda b: b.auto_rank)
    for backend in ranked:
        if queries_differ and not backend.queries_differ:
            continue
        if backend.takes(device_type, dtype, k) and backend.available():
            return backend
    raise ValueError(f"no registered exact search backend takes {dtype} tensors on {device_type!r} for k={k}")
