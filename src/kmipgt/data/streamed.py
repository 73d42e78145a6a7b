"""Graph sequences read from disk on demand, so a split larger than memory is indexed like a list of graphs.

A training loop holds one mini-batch of such a split at a time: a PyTorch ``DataLoader`` asks for a batch's
graphs in one call (``__getitems__``), which reads them together, and nothing read is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import overload

import numpy as np
from torch_geometric.data import Data

__all__ = ["StreamedGraphs"]

Reader = Callable[[list[int]], list[Data]]


class StreamedGraphs(Sequence[Data]):
    """Graphs ``indices`` of a store on disk, read by ``read`` when asked for, then passed through
    ``transforms`` in order.

    Args:
        read: ``read(ids)`` returns the stored graphs ``ids`` (a list of store indices, any order, repeats
            allowed), in that order, as fresh ``Data`` the transforms may change.
        indices: the store indices of this sequence's graphs, in sequence order.
        transforms: functions ``Data -> Data`` applied to every graph read.
        chunk_size: graphs read together by iteration and :meth:`chunks`.

    Indexing with an int reads one graph; with a slice, or :meth:`subset`, gives a view reading nothing.
    """

    def __init__(
        self,
        read: Reader,
        indices: Iterable[int],
        transforms: Sequence[Callable[[Data], Data]] = (),
        chunk_size: int = 64,
    ):
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        self._read = read
        self._indices = np.asarray(list(indices), dtype=np.int64)
        self._transforms = tuple(transforms)
        self.chunk_size = chunk_size

    def _view(self, indices: np.ndarray, transforms: tuple[Callable[[Data], Data], ...]) -> StreamedGraphs:
        return StreamedGraphs(self._read, indices, transforms, self.chunk_size)

    def __len__(self) -> int:
        return len(self._indices)

    @overload
    def __getitem__(self, index: int) -> Data: ...

    @overload
    def __getitem__(self, index: slice) -> StreamedGraphs: ...

    def __getitem__(self, index: int | slice) -> Data | StreamedGraphs:
        if isinstance(index, slice):
            return self._view(self._indices[index], self._transforms)
        return self.__getitems__([index])[0]

    def __getitems__(self, positions: Sequence[int]) -> list[Data]:
        """The graphs at ``positions`` (a mini-batch), read in one call of ``read``."""
        ids = []
        for position in positions:
            if isinstance(position, bool) or not isinstance(position, int | np.integer):
                raise TypeError(f"graph positions must be ints, got {position!r}")
            if not -len(self) <= position < len(self):
                raise IndexError(f"graph {position} does not exist: the sequence has {len(self)} graphs")
            ids.append(int(self._indices[position]))
        graphs = self._read(ids)
        for transform in self._transforms:
            graphs = [transform(graph) for graph in graphs]
        return graphs

    def __iter__(self) -> Iterator[Data]:
        for chunk in self.chunks():
            yield from chunk

    def chunks(self) -> Iterator[list[Data]]:
        """The graphs in order, ``chunk_size`` at a time, each chunk read in one call."""
        for start in range(0, len(self), self.chunk_size):
            yield self.__getitems__(range(start, min(start + self.chunk_size, len(self))))

    def subset(self, positions: Iterable[int]) -> StreamedGraphs:
        """The graphs at ``positions`` of this sequence, in that order, as a view."""
        return self._view(self._indices[np.asarray(list(positions), dtype=np.int64)], self._transforms)

    def map(self, transform: Callable[[Data], Data]) -> StreamedGraphs:
        """This sequence with ``transform`` applied to every graph read, after the present transforms."""
        return self._view(self._indices, (*self._transforms, transform))
