"""Facts remembered per tensor for as long as the tensor is unchanged: a batch's layout, ids checked on the
host before their copy to the device. Reading such a fact back from a CUDA tensor would wait for the
device; remembering it where it was known costs nothing."""

from __future__ import annotations

from typing import Generic, TypeVar

from torch import Tensor
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["TensorMemo"]

V = TypeVar("V")


class TensorMemo(Generic[V]):
    """A value per tensor, held weakly (it lives as long as its tensor) and forgotten when the tensor is
    changed in place (its version counter moves).

    Args:
        keep_inference: inference tensors count no versions; ``True`` remembers their values anyway (their
            owner does not change them), ``False`` never remembers one.
    """

    def __init__(self, keep_inference: bool):
        self.keep_inference = keep_inference
        self._values: WeakTensorKeyDictionary = WeakTensorKeyDictionary()

    @staticmethod
    def _version(tensor: Tensor) -> int | None:
        return None if tensor.is_inference() else tensor._version

    def remember(self, tensor: Tensor, value: V) -> None:
        if self.keep_inference or not tensor.is_inference():
            self._values[tensor] = (self._version(tensor), value)

    def recall(self, tensor: Tensor) -> V | None:
        """The value remembered for ``tensor``, or None (none, or the tensor changed since)."""
        remembered = self._values.get(tensor)
        if remembered is None or remembered[0] != self._version(tensor):
            return None
        return remembered[1]
