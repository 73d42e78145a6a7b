"""The registry of search backends: each backend module registers its name, search function and capabilities.

The dispatcher (:func:`kmipgt.ops.topk_inner_product`) looks backends up here by name, and ``auto`` picks
among them with :func:`route`, by the whole call (:class:`SearchCall`: device, dtype, k, head dim, largest
graph); backends that need an exact search of their own (the IVF indexes, for small graphs) route their
call the same way rather than import another backend.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import Tensor

from kmipgt.ops.search.cuda_device import shared_memory_limit

__all__ = [
    "SearchBackend",
    "SearchCall",
    "get_backend",
    "importable",
    "largest_graph",
    "register",
    "registered_backends",
    "route",
    "search_call",
]

# ``search(query, key, k, ptr, **options)`` with validated ``[M, H, d]`` query, ``[N, H, d]`` key, ``k >= 1``
# and ``[G + 1]`` CPU graph offsets of the queries; returns ``[M, H, k]`` scores and int64 global key indices.
# Approximate backends take the options ``nlist``, ``nprobe``, ``recall`` and ``calibration`` (each may be
# None). Backends flagged ``queries_differ`` also
# take ``key_ptr``, the ``[G + 1]`` offsets of the keys' graphs; the dispatcher passes it only where the
# keys' layout differs from the queries' (otherwise ``M == N`` and the graphs coincide).
SearchFunction = Callable[..., tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class SearchCall:
    """The host facts of one search that decide which backends can serve it; no tensor value is read.

    Attributes:
        device_type: where the tensors are (``"cpu"``, ``"cuda"``, ...).
        dtype: the dtype of query and key.
        k: keys asked per query.
        head_dim: d of the ``[N, H, d]`` query and key.
        max_nodes: keys of the largest graph; slots past it only ever pad.
        queries_differ: whether the keys are laid out in graphs of their own (``key_ptr``).
        shared_memory: bytes of shared memory a kernel block may use on the device
            (:func:`~kmipgt.ops.search.cuda_device.shared_memory_limit`).
    """

    device_type: str
    dtype: torch.dtype
    k: int
    head_dim: int
    max_nodes: int
    queries_differ: bool
    shared_memory: int

    @property
    def slots(self) -> int:
        """The keys a query can have: ``min(k, max_nodes)``."""
        return min(self.k, self.max_nodes)


def largest_graph(ptr: Tensor) -> int:
    """Nodes of the largest graph of ``[G + 1]`` CPU offsets (0 without graphs)."""
    return int(ptr.diff().max()) if ptr.numel() > 1 else 0


def search_call(query: Tensor, k: int, key_ptr: Tensor, *, queries_differ: bool) -> SearchCall:
    """The :class:`SearchCall` of ``[M, H, d]`` queries searching ``k`` keys among graphs laid out by the
    keys' ``[G + 1]`` CPU offsets ``key_ptr``."""
    return SearchCall(
        device_type=query.device.type, dtype=query.dtype, k=k, head_dim=query.shape[-1],
        max_nodes=largest_graph(key_ptr), queries_differ=queries_differ,
        shared_memory=shared_memory_limit(query.device),
    )


@dataclass(frozen=True)
class SearchBackend:
    """One search backend and what it can do.

    Attributes:
        name: the ``backend=`` value that selects it.
        search: the search function (see ``SearchFunction`` above).
        exact: False where the search may miss some of the true top-k (``nlist``/``nprobe``/``recall`` apply).
        available: whether its optional package or compiler is present here (may build or import lazily).
        devices: device types it runs on; ``None``: any device torch runs on.
        dtypes: floating dtypes it takes; ``None``: any.
        queries_differ: whether the keys may be laid out in graphs of their own (``key_ptr``, ``M != N``).
        max_k: the largest number of slots (``min(k, largest graph)``) it searches; ``None``: any.
        fits: a limit beyond these flags that only the backend knows (a kernel's shared memory at the call's
            head dim), as a predicate of the call; ``None``: none.
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
    fits: Callable[[SearchCall], bool] | None = None
    takes_layout: bool = False
    auto_rank: int | None = None

    def takes(self, call: SearchCall) -> bool:
        """Whether ``call`` is within its flags and limits (availability aside)."""
        return (
            (self.devices is None or call.device_type in self.devices)
            and (self.dtypes is None or call.dtype in self.dtypes)
            and (self.max_k is None or call.slots <= self.max_k)
            and (self.queries_differ or not call.queries_differ)
            and (self.fits is None or self.fits(call))
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


def route(call: SearchCall) -> SearchBackend:
    """The exact backend that serves ``call``: the lowest ``auto_rank`` that takes it and is available.

    The one routing decision of the package: ``auto`` and every backend that searches part of its input
    exactly (the IVF indexes' small graphs) call it with the whole call. It decides on host facts alone,
    never on tensor values. Availability is asked last, so a backend is only built or imported for inputs
    it would search.
    """
    ranked = sorted((b for b in _BACKENDS.values() if b.auto_rank is not None), key=lambda b: b.auto_rank)
    for backend in ranked:
        if backend.takes(call) and backend.available():
            return backend
    raise ValueError(f"no registered exact search backend serves {call}")
