"""Bytes each rank sends through torch.distributed, counted per phase (forward, backward, metadata)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

__all__ = ["CommunicationCounter", "active_counter", "count_communication"]


@dataclass
class CommunicationCounter:
    """Bytes this rank sent, by phase: ``{"metadata": ..., "forward": ..., "backward": ...}``.

    A collective counts what this rank puts on the wire: a send its tensor's bytes, an all-gather its own
    contribution once per other rank.
    """

    sent: dict[str, int] = field(default_factory=dict)

    def add(self, phase: str, num_bytes: int) -> None:
        self.sent[phase] = self.sent.get(phase, 0) + num_bytes

    @property
    def total(self) -> int:
        return sum(self.sent.values())


_ACTIVE: list[CommunicationCounter] = []


@contextmanager
def count_communication() -> Iterator[CommunicationCounter]:
    """Count the bytes sent by the sharded operations started inside the block.

    A backward run later, outside the block, still adds to the counter its forward was counted in.
    """
    counter = CommunicationCounter()
    _ACTIVE.append(counter)
    try:
        yield counter
    finally:
        _ACTIVE.remove(counter)


def active_counter() -> CommunicationCounter | None:
    """The innermost :func:`count_communication` counter, or None outside one."""
    return _ACTIVE[-1] if _ACTIVE else None
