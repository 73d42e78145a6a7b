"""Host syncs on CPU: the ops that would make the host wait for a CUDA device, recorded without one.

On CUDA, ``torch.cuda.set_sync_debug_mode("error")`` raises at every host sync; without a GPU,
:class:`HostSyncs` records the ops that force one there:

- reads of a device value on the host: ``aten._local_scalar_dense`` (``.item()``, ``int()``, ``float()``,
  ``bool()``, ``if tensor:``), ``aten.equal``, ``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.__array__``,
  ``Tensor.cpu``, ``Tensor.to("cpu")``, ``aten.copy_`` of a device value into a host tensor;
- ops whose output size depends on the data: ``aten.nonzero`` (``torch.where(mask)``, ``argwhere``),
  ``aten.masked_select``, indexing with a boolean mask, ``aten._unique``/``_unique2``/``unique_dim``/
  ``unique_consecutive``, ``aten.repeat_interleave.Tensor`` without ``output_size``, ``aten.bincount``;
- blocking host-to-device copies: ``Tensor.to(device)`` of a host tensor without
  ``non_blocking=True``, ``torch.tensor(..., device=device)``.

What lives on the device: with ``on_device=None`` every tensor (to test single patterns); otherwise the
given tensors (a model's parameters, a batch moved to the device) and everything computed from them
(an op with a device input puts its outputs and the inputs it writes on the device), factories called with
a ``torch.device`` (``torch.zeros(n, device=x.device)``) and copies to one. Everything else is host data,
such as a batch layout's ``ptr`` or an optimiser's step count, which the host reads without waiting. On
CPU a copy to ``x.device`` and one to ``"cpu"`` are the same op, so only ``"cpu"`` given as a string counts
as the host there: code that keeps host data on ``torch.device("cpu")`` (PyG's collate) is flagged there.
A copy that is a no-op on CPU returns its host input, which stays on the host: pass the batch a step takes
in ``on_device``. What runs is the CPU code path: where code branches on the device (Triton kernels, pinned
copies), the CUDA branch is checked on a GPU by tests/nn/test_cuda_sync.py.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

__all__ = ["HostSync", "HostSyncs"]

_ATEN = torch.ops.aten
# Ops that read a device value back or size their output by the data, whatever their arguments.
_SYNCING = {
    _ATEN._local_scalar_dense.default,
    _ATEN.equal.default,
    _ATEN.nonzero.default,
    _ATEN.masked_select.default,
    _ATEN._unique.default,
    _ATEN._unique2.default,
    _ATEN.unique_dim.default,
    _ATEN.unique_consecutive.default,
    _ATEN.unique_dim_consecutive.default,
    _ATEN.bincount.default,
}
_INDEXING = {
    _ATEN.index.Tensor, _ATEN.index_put.default, _ATEN.index_put_.default, _ATEN._index_put_impl_.default,
}
# Tensor methods that hand a device tensor's values to the host.
_READS = {Tensor.tolist, Tensor.numpy, Tensor.__array__, Tensor.cpu}
_FROM_DATA = {torch.tensor, torch.as_tensor}
_OWN_FILE = str(Path(__file__).resolve())


@dataclass(frozen=True)
class HostSync:
    """One recorded sync: what forced it and the innermost caller outside torch (``file:line in name``)."""

    op: str
    where: str

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"


def _caller() -> str:
    frames = [f for f in traceback.extract_stack() if f.filename != _OWN_FILE]
    outside = [f for f in frames if "/torch/" not in f.filename] or frames
    frame = outside[-1]
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def _boolean(index: object) -> bool:
    return isinstance(index, Tensor) and index.dtype in (torch.bool, torch.uint8)


def _sync_reason(func, args: tuple, kwargs: dict) -> str | None:
    """Why the aten op ``func`` on these arguments would wait for a CUDA device, or None."""
    if func in _SYNCING:
        return str(func)
    if func is _ATEN.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return f"{func} without output_size"
    if func in _INDEXING and any(_boolean(index) for index in args[1]):
        return f"{func} with a boolean mask"
    return None


def _names_host(device: object) -> bool:
    """Whether a device argument names the host: only the string ``"cpu"`` does (see the module doc)."""
    return isinstance(device, str) and device.split(":")[0] == "cpu"


class _Dispatch(TorchDispatchMode):
    def __init__(self, owner: HostSyncs):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [leaf for leaf in tree_leaves((args, kwargs)) if isinstance(leaf, Tensor)]
        from_device = any(self.owner.on_device(tensor) for tensor in inputs)
        reason = _sync_reason(func, args, kwargs)
        if func is _ATEN.copy_.default and not self.owner.on_device(args[0]):  # the source is, then
            reason = f"{func} of a device tensor into a host tensor"
        if reason is not None and from_device:
            self.owner.record(reason)
        out = func(*args, **kwargs)
        if from_device:
            written = [
                value for argument, value in zip(func._schema.arguments, args, strict=False)
                if argument.alias_info is not None and argument.alias_info.is_write
            ]
            written += [value for name, value in kwargs.items() if name == "out"]
            self.owner.put_on_device(tree_leaves((out, written)))
        return out


class _Function(TorchFunctionMode):
    def __init__(self, owner: HostSyncs):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.owner
        if func in _READS and owner.on_device(args[0]):
            owner.record(f"Tensor.{func.__name__}")
        out = func(*args, **kwargs)
        if func is Tensor.to:
            self._copy(args, kwargs, out)
        elif "device" in kwargs and not _names_host(kwargs["device"]):
            if func in _FROM_DATA:
                owner.record(f"torch.{func.__name__}(..., device=...) (a blocking host-to-device copy)")
            owner.put_on_device(tree_leaves(out))
        return out

    def _copy(self, args: tuple, kwargs: dict, out: object) -> None:
        source, rest = args[0], args[1:]
        options = {name: value for name, value in kwargs.items() if name != "copy"}
        device, _, non_blocking, _ = torch._C._nn._parse_to(*rest, **options)
        if device is None:
            return
        target = kwargs.get("device", rest[0] if rest else None)
        if _names_host(target):
            if self.owner.on_device(source):
                self.owner.record("Tensor.to('cpu')")
            return
        if self.owner.on_device(source) or (isinstance(target, Tensor) and not self.owner.on_device(target)):
            return
        if not non_blocking:
            self.owner.record("Tensor.to(device) of a host tensor without non_blocking=True")
        if out is not source:
            self.owner.put_on_device([out])


class HostSyncs:
    """Context manager recording the ops run inside it that would wait for a CUDA device, in
    :attr:`syncs` (see the module doc for the ops and for what counts as being on the device).

    ``on_device``: the tensors on the device (None: every tensor). Backward passes run inside the block
    are seen too (the autograd engine runs CPU graphs on the calling thread).
    """

    def __init__(self, on_device: Iterable[Tensor] | None = None):
        self.everything = on_device is None
        self._device: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.put_on_device(() if on_device is None else on_device)
        self.syncs: list[HostSync] = []
        self._modes = (_Function(self), _Dispatch(self))

    def on_device(self, tensor: object) -> bool:
        """Whether ``tensor`` counts as a device tensor."""
        return isinstance(tensor, Tensor) and (self.everything or tensor in self._device)

    def put_on_device(self, tensors: Iterable[object]) -> None:
        for tensor in tensors:
            if isinstance(tensor, Tensor):
                self._device[tensor] = True

    def record(self, op: str) -> None:
        self.syncs.append(HostSync(op, _caller()))

    def __enter__(self) -> HostSyncs:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
