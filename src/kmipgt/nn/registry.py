"""A registry of named kinds of one sort (attention kinds, local MPNN kinds), with ``"none"`` naming the
absence of one: what :mod:`kmipgt.nn.attention_kinds` and :mod:`kmipgt.nn.local_kinds` share.

Registries and their built-in entries import no torch: a config's kind names are checked against them
before torch loads, so a misspelt name is reported at once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, TypeVar

__all__ = ["NONE", "KindRegistry"]

NONE = "none"


class _Named(Protocol):
    name: str


K = TypeVar("K", bound=_Named)


class KindRegistry(Mapping[str, K]):
    """Kinds by name, in registration order: a read-only mapping, changed through :meth:`register` and
    :meth:`remove` only.

    Args:
        sort: what a kind is, for messages (e.g. ``"attention kind"``).
    """

    def __init__(self, sort: str):
        self.sort = sort
        self._kinds: dict[str, K] = {}

    def __getitem__(self, name: str) -> K:
        return self._kinds[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._kinds)

    def __len__(self) -> int:
        return len(self._kinds)

    def register(self, kind: K) -> K:
        """Add ``kind`` under its name (ValueError if taken or ``"none"``)."""
        if kind.name == NONE:
            raise ValueError(f"{NONE!r} means no {self.sort} and cannot name one")
        if kind.name in self._kinds:
            raise ValueError(f"a {self.sort} named {kind.name!r} is already registered")
        self._kinds[kind.name] = kind
        return kind

    def remove(self, name: str) -> K:
        """Remove the kind registered as ``name`` and return it (one registered for a while, as by a test)."""
        return self._kinds.pop(self.lookup(name).name)

    def names(self) -> tuple[str, ...]:
        """What an argument naming a kind takes: every registered name, then ``"none"``."""
        return (*self._kinds, NONE)

    def lookup(self, name: str) -> K:
        """The kind registered as ``name``; ValueError naming the registered kinds otherwise."""
        if not isinstance(name, str) or name not in self._kinds:
            raise ValueError(f"{self.sort} must be one of {tuple(self._kinds)}, got {name!r}")
        return self._kinds[name]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.sort!r}: {', '.join(self._kinds)})"
