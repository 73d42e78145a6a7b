"""What the ``kmipgt`` custom operators share: a batch's layout as operator arguments, the autocast policy,
and dropout that the backward can replay.

The attention functions of :mod:`kmipgt.ops` run through operators registered with ``torch.library``
(``torch.ops.kmipgt.*``), each with a fake implementation that gives output shapes from input shapes and
host ints alone, so that ``torch.compile`` and ``torch.export`` see one operator per call instead of the
host code that routes it. A layout crosses the operator boundary as tensors: the CPU offsets ``ptr`` that
kernels read on the host, the keys' own offsets where they differ, and the same offsets on the device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from kmipgt.ops.ragged import RaggedLayout

__all__ = [
    "HOST_ROUTED",
    "OpLayout",
    "attention_dtypes",
    "dropout_seed",
    "layout_arguments",
    "op_layout",
    "recording_autograd",
    "replayable_dropout",
    "traced_offsets",
    "without_autocast",
]


# The oldest torch that `make compat` passed on (docs/compatibility.md), as pyproject.toml asks for it. The
# operators need 2.8 (``custom_op(tags=...)``); 2.8 and 2.9 compile the models wrongly or not at all.
OLDEST_TORCH = "2.10"
if torch.__version__ < OLDEST_TORCH:
    raise ImportError(f"kmipgt needs torch {OLDEST_TORCH} or later, got torch {torch.__version__}")

# The tags of an operator that routes each call on the host from the values of the CPU offsets ``ptr``
# (which kernel, its launch grid, the graph blocks). A CUDA graph replays the kernels it captured, not that
# routing: a replay on a batch with other offsets would launch the captured batch's grids. Tagged unsafe to
# capture, the operator runs eagerly between the captured parts under torch.compile(mode="reduce-overhead")
# (inductor's graph partition) and re-routes every call.
HOST_ROUTED = (torch.Tag.cudagraph_unsafe,)


class OpLayout(NamedTuple):
    """A layout as operator arguments: ``ptr`` ``[G + 1]`` CPU offsets of the queries (None: one graph),
    ``key_ptr`` the keys' (None: the queries'), ``device_ptr`` ``ptr`` on the inputs' device (None: copied
    where a kernel needs it)."""

    ptr: Tensor | None
    key_ptr: Tensor | None
    device_ptr: Tensor | None


def layout_arguments(layout: RaggedLayout | None, ptr: Tensor | None, key_ptr: Tensor | None) -> OpLayout:
    """The operator arguments of a call given either its ``layout`` (device offsets included) or its
    validated CPU offsets."""
    if layout is None:
        return OpLayout(ptr, key_ptr, None)
    device_ptr = layout.device_ptr if layout.device.type != "cpu" else None
    return OpLayout(layout.ptr, None, device_ptr)


def op_layout(
    num_nodes: int, ptr: Tensor | None, device_ptr: Tensor | None, device: torch.device
) -> RaggedLayout:
    """Inside an operator: the :class:`RaggedLayout` of its arguments (one graph of ``num_nodes`` rows where
    ``ptr`` is None), with the device offsets the caller passed."""
    if ptr is None:
        ptr = torch.tensor([0, num_nodes])
        device_ptr = None
    return RaggedLayout(ptr, device, device_ptr=device_ptr)


def traced_offsets(
    ptr: Tensor | None, batch: Tensor | None, key_ptr: Tensor | None, key_batch: Tensor | None,
    layout: RaggedLayout | None,
) -> tuple[Tensor | None, Tensor | None]:
    """The CPU offsets of a call being compiled or exported, read from no value: ``layout``'s, else
    ``ptr``/``key_ptr`` as given (None: one graph, the queries' layout). Sorted ``batch`` ids would have to
    be read: ValueError."""
    if batch is not None or key_batch is not None:
        raise ValueError(
            "a compiled or exported call takes its graphs as `layout` or `ptr`/`key_ptr` (graph offsets): "
            "sorted `batch`/`key_batch` ids would have to be read"
        )
    if layout is not None:
        return layout.ptr, None
    return (None if ptr is None else ptr.cpu().long()), (None if key_ptr is None else key_ptr.cpu().long())


def attention_dtypes(query: Tensor, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The autocast policy of the attention operators: under autocast, queries and keys in float32 (the
    search and the softmax at float32 accuracy) and values in the autocast dtype (the weighted sum runs
    in it); outside autocast, the inputs as they are.

    Custom operators are not cast by autocast, so the policy is applied before the call; inside, the
    operators run with autocast off (:func:`without_autocast`).
    """
    device = query.device.type
    if not torch.is_autocast_enabled(device):
        return query, key, value
    low = torch.get_autocast_dtype(device)
    return query.float(), key.float(), value.to(low)


@contextlib.contextmanager
def without_autocast(device: torch.device) -> Iterator[None]:
    """Autocast off on ``device``: an operator's kernels compute in the dtypes it was given."""
    with torch.autocast(device.type, enabled=False):
        yield


def dropout_seed(dropout_p: float) -> Tensor | None:
    """A CPU seed for the dropout of one operator call (drawn from torch's CPU generator, so
    ``torch.manual_seed`` fixes it), or None without dropout."""
    if dropout_p == 0:
        return None
    return torch.randint(0, 2**62, (), dtype=torch.long)


@contextlib.contextmanager
def replayable_dropout(seed: Tensor | None, device: torch.device) -> Iterator[None]:
    """The default generator of ``device`` seeded from ``seed`` within the block and restored after it, so
    a backward that recomputes the forward draws the same dropout masks; nothing without a seed."""
    if seed is None:
        yield
        return
    if device.type == "cuda":
        generator = torch.cuda.default_generators[
            device.index if device.index is not None else torch.cuda.current_device()
        ]
    else:
        generator = torch.random.default_generator
    state = generator.get_state()
    generator.manual_seed(int(seed))
    try:
        yield
    finally:
        generator.set_state(state)


# The dispatch keys of autograd recording: every backend's Autograd key and ADInplaceOrView.
_AUTOGRAD_KEYS = [
    key for name, key in torch._C.DispatchKey.__members__.items()
    if name.startswith("Autograd") or name == "ADInplaceOrView"
]


@contextlib.contextmanager
def recording_autograd() -> Iterator[None]:
    """Autograd records again inside an operator's implementation, which the dispatcher runs below
    autograd: a backward that recomputes its forward and differentiates it (through SDPA's own backward
    kernels) needs it. ``torch.func.vjp`` would too, but it crashes under a ``TorchDispatchMode`` (a
    FLOP counter, a sync recorder)."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    include = torch._C._dispatch_tls_local_include_set()
    with torch._C._ForceDispatchKeyGuard(include, exclude), torch.enable_grad():
        yield
