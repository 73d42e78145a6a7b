"""k-MIP attention over a batch of small graphs in one C++ kernel per pass (CPU).

On batches of many small graphs (LRGB, molecules) the search, the softmax and the ``[N, H, k, d]``
gathers of :func:`kmipgt.ops.kmip_attention` each cost a pass over memory, and the gathers dominate.
``csrc/kmip_attention.cpp`` (built by :mod:`kmipgt.ops.cpp_build`) does all of it per (graph, head) while
the graph's keys sit in cache: scores, top-k, softmax and weighted sum of the values forward; the
gradients from the saved selection backward. Its selection is bit for bit that of the ``fused`` search.
A large graph is one task per head, so it fills at most H threads and its keys no longer stay in cache:
above some thousands of nodes the search-then-gather path is the faster one.
"""

from __future__ import annotations

import ctypes
import functools
from pathlib import Path

import torch
from torch import Tensor

from kmipgt.cache_dir import cache_dir
from kmipgt.ops.cpp_build import CPP_FLAGS, compiled_library, find_compiler

__all__ = ["fused_attention_available", "fused_backward", "fused_forward", "fused_kmip_attention"]

_SOURCE = Path(__file__).with_name("csrc") / "kmip_attention.cpp"
# Computed in float32: half types are upcast without rounding; float64 would lose precision (refused).
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL | None:
    library = compiled_library(
        _SOURCE,
        compiler=find_compiler(),
        flags=CPP_FLAGS,
        directory=cache_dir(),
        purpose="the fused CPU k-MIP attention",
        fallback="k-MIP attention searches and gathers instead",
    )
    if library is None:
        return None
    pointer, size, real = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    library.kmip_attention_forward.argtypes = [
        pointer, pointer, pointer, size, size, size, size, size, size, pointer, real,
        pointer, pointer, pointer, pointer, ctypes.c_int,
    ]
    library.kmip_attention_forward.restype = ctypes.c_int
    library.kmip_attention_backward.argtypes = [
        pointer, pointer, pointer, pointer, pointer, pointer, size, size, size, size, size, size, pointer,
        real, pointer, pointer, pointer, ctypes.c_int,
    ]
    library.kmip_attention_backward.restype = ctypes.c_int
    return library


def fused_attention_available() -> bool:
    """Whether the kernel builds and loads here (built on first call; warns once where it cannot)."""
    return _library() is not None


def _checked_library() -> ctypes.CDLL:
    library = _library()
    if library is None:
        raise RuntimeError(
            "the fused CPU k-MIP attention could not be built on this machine (see the warning above); "
            "check fused_attention_available() first"
        )
    return library


def _float32(tensor: Tensor) -> Tensor:
    return tensor.detach().to(torch.float32).contiguous()


def _raise_on(status: int) -> None:
    """The kernels' status: 0 done, 1 ``ptr`` refused, 2 out of memory."""
    if status == 1:
        raise ValueError("`ptr` must hold CSR offsets of the N rows (start at 0, non-decreasing, end at N)")
    if status == 2:
        raise MemoryError("the fused k-MIP attention could not allocate its working memory")


def _pointer(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def fused_forward(
    query: Tensor, key: Tensor, value: Tensor, k: int, ptr: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The C++ forward on checked inputs: ``(out, index, score, weight)`` as :func:`fused_kmip_attention`
    returns them, without autograd."""
    num_nodes, heads, dim = query.shape
    dim_v = value.shape[-1]
    # Named, so that upcast copies outlive the call that reads their pointers.
    query32, key32, value32 = _float32(query), _float32(key), _float32(value)
    out = torch.empty(num_nodes, heads, dim_v)
    index = torch.empty(num_nodes, heads, k, dtype=torch.long)
    score, weight = torch.empty(num_nodes, heads, k), torch.empty(num_nodes, heads, k)
    status = _checked_library().kmip_attention_forward(
        query32.data_ptr(), key32.data_ptr(), value32.data_ptr(), num_nodes, heads, dim, dim_v, k,
        ptr.numel() - 1, ptr.data_ptr(), scale, out.data_ptr(), index.data_ptr(), score.data_ptr(),
        weight.data_ptr(), torch.get_num_threads(),
    )
    _raise_on(status)
    return out.to(value.dtype), index, score.to(query.dtype), weight


def fused_backward(
    query: Tensor, key: Tensor, value: Tensor, grad_out: Tensor, index: Tensor, weight: Tensor, ptr: Tensor,
    scale: float, needs: tuple[bool, bool, bool] = (True, True, True),
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The C++ backward: gradients of query, key and value (None where ``needs`` says so) from the
    forward's selection ``index`` and ``weight`` ``[N, H, k]``."""
    inputs = (query, key, value)
    grads = [torch.empty(t.shape) if want else None for t, want in zip(inputs, needs)]
    query32, key32, value32, grad_out32 = (_float32(t) for t in (*inputs, grad_out))
    status = _checked_library().kmip_attention_backward(
        query32.data_ptr(), key32.data_ptr(), value32.data_ptr(), grad_out32.data_ptr(),
        index.data_ptr(), weight.data_ptr(), *query.shape, value.shape[-1], index.shape[-1],
        ptr.numel() - 1, ptr.data_ptr(), scale, *(_pointer(grad) for grad in grads),
        torch.get_num_threads(),
    )
    _raise_on(status)
    return tuple(None if grad is None else grad.to(t.dtype) for grad, t in zip(grads, inputs))


class _FusedKMIPAttention(torch.autograd.Function):
    """The C++ forward and backward; saves only the inputs and the ``[N, H, k]`` selection."""

    @staticmethod
    def forward(ctx, query, key, value, k, ptr, scale):
        ctx.set_materialize_grads(False)
        out, index, score, weight = fused_forward(query, key, value, k, ptr, scale)
        ctx.save_for_backward(query, key, value, index, weight, ptr)
        ctx.scale = scale
        ctx.mark_non_differentiable(index, score, weight)
        return out, index, score, weight

    @staticmethod
    def backward(ctx, grad_out, _grad_index, _grad_score, _grad_weight):
        if grad_out is None:  # grads are not materialised: nothing flowed back into the output
            return None, None, None, None, None, None
        query, key, value, index, weight, ptr = ctx.saved_tensors
        grads = fused_backward(
            query, key, value, grad_out, index, weight, ptr, ctx.scale, tuple(ctx.needs_input_grad[:3])
        )
        return (*grads, None, None, None)


def fused_kmip_attention(
    query: Tensor, key: Tensor, value: Tensor, k: int, ptr: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""k-MIP attention within each graph of a node-major batch, forward and backward in C++ (CPU).

    .. math::
        \mathrm{out}_i = \sum_{j \in T_k(i)} \operatorname{softmax}_j(s\, q_i \cdot k_j)\, v_j,
        \qquad T_k(i) = \operatorname{argtop-}k_{j \in g(i)}\; q_i \cdot k_j

    The same result as :func:`kmipgt.ops.kmip_attention` with ``backend="fused"`` and no dropout: the same
    keys (searched in float32, ties to the lower index), outputs equal to float32 rounding.

    Args:
        query, key: ``[N, H, d]`` CPU float32, float16 or bfloat16 (half types are computed in float32);
            the queries are the keys' nodes.
        value: ``[N, H, d_v]``, same dtype.
        k: keys per query (``>= 1``); a graph of fewer nodes fills its first slots and pads the rest.
        ptr: ``[G + 1]`` CPU int64 offsets of the graphs (:func:`kmipgt.ops.graph_ptr`); empty graphs allowed.
        scale: logit scale :math:`s`.

    Returns:
        ``(out, index, score, weight)``: ``out`` ``[N, H, d_v]`` (value dtype), differentiable w.r.t. query,
        key and value; ``index`` ``[N, H, k]`` int64 global key rows, best first (``-1`` at padding);
        ``score`` ``[N, H, k]`` unscaled inner products (query dtype, ``-inf`` at padding); ``weight``
        ``[N, H, k]`` float32 softmax weights (0 at padding), as :class:`kmipgt.ops.AttentionSelection`.

    Raises:
        TypeError: float64 or another dtype (the caller keeps the torch path for those).
        ValueError: tensors off the CPU, mismatched shapes, ``k < 1`` or ``ptr`` not offsets of the N rows.
        RuntimeError: where the kernel cannot be built (see :func:`fused_attention_available`).
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if tensor.dtype not in _DTYPES:
            raise TypeError(f"`{name}` must be one of {_DTYPES} for the fused attention, got {tensor.dtype}")
        if tensor.device.type != "cpu":
            raise ValueError(f"`{name}` must be on the CPU for the fused attention, got {tensor.device}")
        if tensor.dim() != 3:
            raise ValueError(f"`{name}` must have shape [N, H, d], got {tuple(tensor.shape)}")
    if key.shape != query.shape or value.shape[:2] != query.shape[:2]:
        raise ValueError(
            f"`query`/`key` must be [N, H, d] and `value` [N, H, d_v] over the same nodes, got "
            f"{tuple(query.shape)}, {tuple(key.shape)}, {tuple(value.shape)}"
        )
    if not query.dtype == key.dtype == value.dtype:
        dtypes = f"{query.dtype}, {key.dtype}, {value.dtype}"
        raise TypeError(f"`query`, `key`, `value` must share a dtype, got {dtypes}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"`k` must be an integer >= 1, got {k!r}")
    if ptr.dtype != torch.long or ptr.device.type != "cpu" or ptr.dim() != 1 or ptr.numel() == 0:
        got = f"{ptr.dtype} of shape {tuple(ptr.shape)} on {ptr.device}"
        raise ValueError(f"`ptr` must be a non-empty one-dimensional CPU int64 tensor, got {got}")
    return _FusedKMIPAttention.apply(query, key, value, k, ptr.contiguous(), float(scale))
