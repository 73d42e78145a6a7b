"""The ``kmipgt::kmip_attention`` operator: k-MIP attention as one ``torch.library`` operator, with its fake
(shape-only) implementation and its autograd formula.

Inside, the call is routed on host facts (device, dtypes, k, head dims, the largest graph read from the
CPU offsets): a batch of small graphs to a fused kernel (:mod:`kmipgt.ops.small_graphs`), anything else to
a search backend (:func:`kmipgt.ops.topk_inner_product`) then softmax over the selected keys
(:mod:`kmipgt.ops.selected_softmax`). A compiled or exported model sees the operator, not the routing.
The backward (``kmipgt::kmip_attention_backward``) takes the fused kernels' backward where they serve
the call and the gathered formulas otherwise; both differentiate the same selection.

Outputs have ``k`` slots whatever the graphs: a graph of fewer keys fills its first slots and pads the
rest (index ``-1``, score ``-inf``, weight 0), so the fake implementation needs no graph size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt.ops.gathers import accumulate_dtype
from kmipgt.ops.library import HOST_ROUTED, op_layout, without_autocast
from kmipgt.ops.search.dispatch import search
from kmipgt.ops.selected_softmax import padding_rows, selected_softmax_backward, selected_softmax_forward
from kmipgt.ops.small_graphs import fused_kernel

__all__: list[str] = []


def _largest_key_graph(ptr: Tensor, key_ptr: Tensor | None) -> int:
    offsets = ptr if key_ptr is None else key_ptr
    return int(offsets.diff().max()) if offsets.numel() > 1 else 0


def _padded(tensor: Tensor, k: int, fill) -> Tensor:
    """``[M, H, k']`` padded with ``fill`` to ``[M, H, k]``."""
    missing = k - tensor.shape[-1]
    return tensor if missing == 0 else F.pad(tensor, (0, missing), value=fill)


def _may_fuse(backend: str, options: dict, key_ptr: Tensor | None, dropout_p: float) -> bool:
    """Whether a call may take a fused kernel: ``auto`` chose the search, with no approximate search's
    options, the queries are the keys and there is no dropout (the kernels keep no dropout mask)."""
    exact = all(value is None for value in options.values())
    return backend == "auto" and exact and key_ptr is None and dropout_p == 0


def _no_keep(weight: Tensor) -> Tensor:
    """The ``keep`` output of a call without dropout: an empty mask."""
    return weight.new_empty(0, dtype=torch.bool)


@torch.library.custom_op("kmipgt::kmip_attention", mutates_args=(), tags=HOST_ROUTED)
def _kmip_attention_op(
    query: Tensor, key: Tensor, value: Tensor, k: int, ptr: Tensor | None, key_ptr: Tensor | None,
    device_ptr: Tensor | None, index: Tensor | None, score: Tensor | None, scale: float, dropout_p: float,
    backend: str, nlist: int | None, nprobe: int | None, recall: float | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """k-MIP attention on checked inputs: ``(out, index, score, weight, keep)``.

    ``ptr``/``key_ptr``: CPU offsets of the queries' and the keys' graphs (None: one graph; the queries'
    layout); ``device_ptr``: ``ptr`` on the device where the caller has it. ``index``/``score``: a
    selection already searched (an approximate search that reports its recall), else searched here with
    ``backend`` (and the approximate backends' ``nlist``, ``nprobe``, ``recall``). ``keep``: the dropout's
    ``[M, H, k]`` mask, empty without dropout.
    """
    with without_autocast(query.device):
        return _forward(query, key, value, k, ptr, key_ptr, device_ptr, index, score, scale, dropout_p,
                        backend, {"nlist": nlist, "nprobe": nprobe, "recall": recall})


def _forward(
    query, key, value, k, ptr, key_ptr, device_ptr, index, score, scale, dropout_p, backend, options
):
    num_queries, num_keys = query.shape[0], key.shape[0]
    layout = op_layout(num_queries, ptr, device_ptr, query.device) if key_ptr is None else None
    host_ptr = layout.ptr if layout is not None else ptr
    slots = min(k, _largest_key_graph(host_ptr, key_ptr))
    if index is not None:  # returned: an operator's outputs may not alias its inputs
        index, score = index.clone(), score.clone()
    elif _may_fuse(backend, options, key_ptr, dropout_p):
        kernel = fused_kernel(query, value.shape[-1], slots, layout) if slots > 0 else None
        if kernel is not None:
            out, index, score, weight = kernel.forward(query, key, value.to(query.dtype), scale)
            weight = _padded(weight, k, 0.0)
            return (out.to(value.dtype), _padded(index, k, -1), _padded(score.to(query.dtype), k, -torch.inf),
                    weight, _no_keep(weight))
    if index is None:
        where = {"layout": layout} if layout is not None else {"ptr": ptr, "key_ptr": key_ptr}
        score, index = search(query, key, max(slots, 1), backend=backend, **where, **options)
        index, score = index[..., :slots], score[..., :slots]
    pad_row = padding_rows(host_ptr, key_ptr, num_queries, num_keys, query.device)
    out, weight, keep = selected_softmax_forward(query, key, value, index, pad_row, scale, dropout_p)
    keep = _no_keep(weight) if keep is None else _padded(keep, k, False)
    return out, _padded(index, k, -1), _padded(score, k, -torch.inf), _padded(weight, k, 0.0), keep


@_kmip_attention_op.register_fake
def _(query, key, value, k, ptr, key_ptr, device_ptr, index, score, scale, dropout_p, backend, nlist, nprobe,
      recall):
    slots = (query.shape[0], query.shape[1], k)
    weight = query.new_empty(slots, dtype=accumulate_dtype(query))
    keep = weight.new_empty(slots if dropout_p > 0 else (0,), dtype=torch.bool)
    return (value.new_empty(query.shape[0], value.shape[1], value.shape[2]),
            query.new_empty(slots, dtype=torch.long), query.new_empty(slots), weight, keep)


@torch.library.custom_op("kmipgt::kmip_attention_backward", mutates_args=(), tags=HOST_ROUTED)
def _kmip_attention_backward_op(
    grad_out: Tensor, query: Tensor, key: Tensor, value: Tensor, index: Tensor, weight: Tensor, keep: Tensor,
    ptr: Tensor | None, key_ptr: Tensor | None, device_ptr: Tensor | None, scale: float, dropout_p: float,
    may_fuse: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gradients of :func:`_kmip_attention_op`'s ``out`` with respect to query, key and value, from the
    selection it saved; by a fused kernel where ``may_fuse`` (the forward could take one) and one serves
    the call, else by the gathered formulas."""
    with without_autocast(query.device):
        num_queries, num_keys = query.shape[0], key.shape[0]
        layout = op_layout(num_queries, ptr, device_ptr, query.device) if key_ptr is None else None
        host_ptr = layout.ptr if layout is not None else ptr
        slots = min(index.shape[-1], _largest_key_graph(host_ptr, key_ptr))
        index, weight = index[..., :slots], weight[..., :slots]
        if may_fuse and slots > 0:
            kernel = fused_kernel(query, value.shape[-1], slots, layout)
            if kernel is not None:
                grads = kernel.backward(query, key, value.to(query.dtype), grad_out.to(query.dtype), index,
                                        weight, scale)
                return tuple(g.to(t.dtype) for g, t in zip(grads, (query, key, value), strict=True))
        keep = keep[..., :slots] if dropout_p > 0 else None
        pad_row = padding_rows(host_ptr, key_ptr, num_queries, num_keys, query.device)
        return selected_softmax_backward(grad_out, query, key, value, index, pad_row, weight, keep, scale,
                                         dropout_p)


@_kmip_attention_backward_op.register_fake
def _(grad_out, query, key, value, index, weight, keep, ptr, key_ptr, device_ptr, scale, dropout_p, may_fuse):
    return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value)


def _save_selection(ctx, inputs, output) -> None:
    query, key, value, _k, ptr, key_ptr, device_ptr, given, _score, scale, dropout_p, backend, *search = (
        inputs
    )
    _out, index, _score, weight, keep = output
    ctx.save_for_backward(query, key, value, index, weight, keep, ptr, key_ptr, device_ptr)
    ctx.scale, ctx.dropout_p = scale, dropout_p
    options = dict(zip(("nlist", "nprobe", "recall"), search, strict=True))
    ctx.may_fuse = given is None and _may_fuse(backend, options, key_ptr, dropout_p)


def _kmip_attention_grads(ctx, grad_out, *_):
    query, key, value, index, weight, keep, ptr, key_ptr, device_ptr = ctx.saved_tensors
    grads = torch.ops.kmipgt.kmip_attention_backward(
        grad_out, query, key, value, index, weight, keep, ptr, key_ptr, device_ptr, ctx.scale, ctx.dropout_p,
        ctx.may_fuse,
    )
    return (*grads, *[None] * 12)


_kmip_attention_op.register_autograd(_kmip_attention_grads, setup_context=_save_selection)
