"""Fused k-MIP attention of batches of small graphs in Triton: search, softmax and sum in one launch.

For graphs of at most ``MAX_FUSED_NODES`` (256) nodes all of a graph's keys fit in one register block,
so one forward program per (graph, query tile, head) scores its queries against all of them with one
``tl.dot``, selects the k best per query (k rounds of a row argmax with the lowest index among ties),
softmaxes the selected scores and sums the selected value rows, without writing a score to global
memory. A backward program per (graph, key chunk, head) owns up to 64 keys: it visits the graph's query
tiles in order, recomputes each query's logit gradients from the saved slots (index, weight) and the
gathered value rows, rebuilds the ``[queries, owned keys]`` weight and logit-gradient matrices by
comparing key rows with the slots, and accumulates the key and value gradients with ``tl.dot`` in
registers; so every gradient row has one writer and no atomics are needed (deterministic).

Only host integers (``ptr.numel()``, the head count, ``max_nodes``) size the grids and blocks; graph
bounds are read from the device ``ptr`` inside the kernels, so neither pass synchronises with the host.
Blocks, warps and the compile-time bucket of k come from the launch plan
(:mod:`~kmipgt.ops.triton_attention_plan`), sized to the device's shared memory; the launches run on the
inputs' device (:func:`~kmipgt.ops.search.cuda_device.device_guard`). ``TRITON_INTERPRET=1`` runs the same
kernels on CPU tensors (for testing without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kmipgt.ops.search.backends.triton_search import TRITON_DTYPES
from kmipgt.ops.search.cuda_device import device_guard, shared_memory_limit
from kmipgt.ops.search.triton_kernel import positive_zero
from kmipgt.ops.triton_attention_plan import MAX_FUSED_K, MAX_FUSED_NODES, AttentionPlan, attention_plan

__all__ = ["triton_backward", "triton_forward", "triton_kmip_attention"]

# Scores are ranked as int32 keys whose order is the float order: below every score, the taken or
# padding slot; above every score, NaN (first, as the exact search ranks it).
_TAKEN = tl.constexpr(-(2**31))
_NAN_KEY = tl.constexpr(2**31 - 1)


@triton.jit
def _rows(base, rows, head, width, s_n, s_h, s_d, ok, BLOCK: tl.constexpr):
    """``[BLOCK_M, BLOCK]`` float32 rows ``base[rows, head, :width]`` (0 where not ``ok``)."""
    cols = tl.arange(0, BLOCK)
    return tl.load(
        base + rows[:, None] * s_n + head * s_h + cols[None, :] * s_d,
        mask=ok[:, None] & (cols[None, :] < width), other=0.0,
    ).to(tl.float32)


@triton.jit
def _slot(slots, values, r):
    """Column ``r`` of the ``[BLOCK_M, K_PAD]`` slot tensor ``values`` (registers cannot be indexed)."""
    return tl.sum(tl.where(slots[None, :] == r, values, 0), axis=1)


# k is a run-time argument that Triton must not specialise (on k = 1 or k divisible by 16) either: then a
# kernel compiles once per bucket of k (K_PAD), whatever the k of each batch.
@triton.jit(do_not_specialize=["k"])
def _forward_kernel(
    query, key, value, ptr, out, out_index, out_score, out_weight,
    q_sn, q_sh, q_sd, k_sn, k_sh, k_sd, v_sn, v_sh, v_sd,
    heads, dim, dim_v, scale, k,
    K_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    graph = tl.program_id(0)
    tile = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(ptr + graph)
    end = tl.load(ptr + graph + 1)
    first = start + tile * BLOCK_M
    if first >= end:
        return
    rows = first + tl.arange(0, BLOCK_M)
    row_ok = rows < end
    cols = tl.arange(0, BLOCK_N)
    col_ok = cols < end - start
    dims = tl.arange(0, BLOCK_D)
    q = tl.load(
        query + rows[:, None] * q_sn + head * q_sh + dims[None, :] * q_sd,
        mask=row_ok[:, None] & (dims[None, :] < dim), other=0.0,
    )
    kt = tl.load(
        key + (start + cols)[None, :] * k_sn + head * k_sh + dims[:, None] * k_sd,
        mask=col_ok[None, :] & (dims[:, None] < dim), other=0.0,
    )
    # Half inputs: exact products, float32 sums. float32 inputs: tf32x3, float32 accuracy from three
    # tensor-core products, as the search kernel scores.
    scores = positive_zero(tl.dot(q, kt, input_precision="tf32x3"))
    bits = scores.to(tl.int32, bitcast=True)
    ranked = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    ranked = tl.where(scores != scores, _NAN_KEY, ranked)
    ranked = tl.where(row_ok[:, None] & col_ok[None, :], ranked, _TAKEN)
    slots = tl.arange(0, K_PAD)
    slot_key = tl.full((BLOCK_M, K_PAD), _TAKEN, tl.int32)
    slot_col = tl.zeros((BLOCK_M, K_PAD), tl.int32)
    for r in range(k):
        # One pass per slot: the largest key left, the lowest column among equal ones.
        best, chosen = tl.max(ranked, axis=1, return_indices=True, return_indices_tie_break_left=True)
        here = slots[None, :] == r
        slot_key = tl.where(here, best[:, None], slot_key)
        slot_col = tl.where(here, chosen[:, None], slot_col)
        ranked = tl.where(cols[None, :] == chosen[:, None], _TAKEN, ranked)
    found = slot_key != _TAKEN
    score_bits = tl.where(slot_key >= 0, slot_key, slot_key ^ 0x7FFFFFFF)
    score = tl.where(found, score_bits.to(tl.float32, bitcast=True), float("-inf"))
    logit = tl.where(found, score * scale, float("-inf"))
    top = tl.max(logit, axis=1)
    top = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.where(found, tl.exp(logit - top[:, None]), 0.0)
    total = tl.sum(weight, axis=1)
    weight = weight / tl.where(total == 0.0, 1.0, total)[:, None]
    selected = tl.where(found, start + slot_col, -1)
    # The selected value rows are gathered (only selected rows of this graph: a NaN elsewhere never meets
    # a zero weight) and summed in float32; the unrolled loop issues the gathers together (slots past k
    # hold row -1 and load nothing).
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)
    for r in tl.static_range(K_PAD):
        row = _slot(slots, selected, r)
        value_row = _rows(value, row, head, dim_v, v_sn, v_sh, v_sd, row >= 0, BLOCK_DV)
        acc += _slot(slots, weight, r)[:, None] * value_row
    dims_v = tl.arange(0, BLOCK_DV)
    out_at = (rows[:, None] * heads + head) * dim_v + dims_v[None, :]
    tl.store(out + out_at, acc.to(out.dtype.element_ty), mask=row_ok[:, None] & (dims_v[None, :] < dim_v))
    slot_at = (rows[:, None] * heads + head) * k + slots[None, :]
    slot_ok = row_ok[:, None] & (slots[None, :] < k)
    tl.store(out_index + slot_at, selected, mask=slot_ok)
    tl.store(out_score + slot_at, score, mask=slot_ok)
    tl.store(out_weight + slot_at, weight, mask=slot_ok)


@triton.jit(do_not_specialize=["k"])
def _backward_kernel(
    query, key, value, grad_out, ptr, index, weight, grad_query, grad_key, grad_value,
    q_sn, q_sh, q_sd, k_sn, k_sh, k_sd, v_sn, v_sh, v_sd, g_sn, g_sh, g_sd,
    heads, dim, dim_v, scale, k,
    K_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
):
    graph = tl.program_id(0)
    chunk = tl.program_id(1)
    head = tl.program_id(2)
    start = tl.load(ptr + graph)
    end = tl.load(ptr + graph + 1)
    own = start + chunk * BLOCK_N
    if own >= end:
        return
    # This program owns BLOCK_N keys of its graph and head: it visits every query tile of the graph in
    # order and accumulates the keys' gradients in registers, so each gradient row has one writer (no
    # atomics: deterministic). Query tile t's gradient is written by key chunk t mod (chunks of the graph).
    chunks = (end - start + BLOCK_N - 1) // BLOCK_N
    key_rows = own + tl.arange(0, BLOCK_N)
    key_ok = key_rows < end
    dims = tl.arange(0, BLOCK_D)
    dims_v = tl.arange(0, BLOCK_DV)
    slots = tl.arange(0, K_PAD)
    key_grad = tl.zeros((BLOCK_N, BLOCK_D), tl.float32)
    value_grad = tl.zeros((BLOCK_N, BLOCK_DV), tl.float32)
    for first in range(start, end, BLOCK_M):
        rows = first + tl.arange(0, BLOCK_M)
        row_ok = rows < end
        slot_at = (rows[:, None] * heads + head) * k + slots[None, :]
        slot_ok = row_ok[:, None] & (slots[None, :] < k)
        selected = tl.load(index + slot_at, mask=slot_ok, other=-1)
        w = tl.load(weight + slot_at, mask=slot_ok, other=0.0)
        go = _rows(grad_out, rows, head, dim_v, g_sn, g_sh, g_sd, row_ok, BLOCK_DV)
        # d out / d weight of each slot: its value row against the output gradient. The slot loops here
        # are not unrolled: at k = 64 that took ptxas over 10 minutes.
        grad_w = tl.zeros((BLOCK_M, K_PAD), tl.float32)
        for r in range(k):
            row = _slot(slots, selected, r)
            value_row = _rows(value, row, head, dim_v, v_sn, v_sh, v_sd, row >= 0, BLOCK_DV)
            grad_w = tl.where(slots[None, :] == r, tl.sum(go * value_row, axis=1)[:, None], grad_w)
        delta = tl.sum(w * grad_w, axis=1)
        grad_logit = tl.where(selected >= 0, w * (grad_w - delta[:, None]) * scale, 0.0)
        if ((first - start) // BLOCK_M) % chunks == chunk:
            q_grad = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)
            for r in range(k):
                row = _slot(slots, selected, r)
                key_row = _rows(key, row, head, dim, k_sn, k_sh, k_sd, row >= 0, BLOCK_D)
                q_grad += _slot(slots, grad_logit, r)[:, None] * key_row
            q_at = (rows[:, None] * heads + head) * dim + dims[None, :]
            tl.store(
                grad_query + q_at, q_grad.to(grad_query.dtype.element_ty),
                mask=row_ok[:, None] & (dims[None, :] < dim),
            )
        # The [queries, owned keys] weights and logit gradients, from the slots (a key fills at most one
        # slot of a query; padding slots hold -1, which no key row matches).
        p = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        grad_s = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
        for r in range(k):
            hit = key_rows[None, :] == _slot(slots, selected, r)[:, None]
            p = tl.where(hit, _slot(slots, w, r)[:, None], p)
            grad_s = tl.where(hit, _slot(slots, grad_logit, r)[:, None], grad_s)
        q = _rows(query, rows, head, dim, q_sn, q_sh, q_sd, row_ok, BLOCK_D)
        key_grad += tl.dot(tl.trans(grad_s), q, input_precision="tf32x3")
        value_grad += tl.dot(tl.trans(p), go, input_precision="tf32x3")
    k_at = (key_rows[:, None] * heads + head) * dim + dims[None, :]
    tl.store(
        grad_key + k_at, key_grad.to(grad_key.dtype.element_ty), mask=key_ok[:, None] & (dims[None, :] < dim)
    )
    v_at = (key_rows[:, None] * heads + head) * dim_v + dims_v[None, :]
    tl.store(
        grad_value + v_at, value_grad.to(grad_value.dtype.element_ty),
        mask=key_ok[:, None] & (dims_v[None, :] < dim_v),
    )


def triton_forward(
    query: Tensor, key: Tensor, value: Tensor, ptr: Tensor, k: int, max_nodes: int, scale: float,
    plan: AttentionPlan,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The forward launch on checked inputs: ``(out, index, score, weight)`` as
    :func:`triton_kmip_attention` returns them, without autograd."""
    num_nodes, heads, dim = query.shape
    dim_v = value.shape[-1]
    device = query.device
    out = torch.empty(num_nodes, heads, dim_v, dtype=value.dtype, device=device)
    index = torch.empty(num_nodes, heads, k, dtype=torch.long, device=device)
    score = torch.empty(num_nodes, heads, k, dtype=torch.float32, device=device)
    weight = torch.empty(num_nodes, heads, k, dtype=torch.float32, device=device)
    graphs = ptr.numel() - 1
    if num_nodes > 0 and heads > 0 and graphs > 0 and max_nodes > 0:
        grid = (graphs, triton.cdiv(max_nodes, plan.block_m), heads)
        with device_guard(device):
            _forward_kernel[grid](
                query, key, value, ptr, out, index, score, weight,
                *query.stride(), *key.stride(), *value.stride(),
                heads, dim, dim_v, scale, k, K_PAD=plan.k_pad,
                BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_D=plan.block_d,
                BLOCK_DV=plan.block_dv, num_warps=plan.warps,
            )
    return out, index, score, weight


def triton_backward(
    query: Tensor, key: Tensor, value: Tensor, grad_out: Tensor, ptr: Tensor, index: Tensor,
    weight: Tensor, max_nodes: int, scale: float, plan: AttentionPlan,
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward launch: gradients of query, key and value from the forward's selection ``index`` and
    ``weight`` ``[N, H, k]``."""
    num_nodes, heads, dim = query.shape
    dim_v = value.shape[-1]
    grad_query, grad_key, grad_value = (torch.empty_like(t, memory_format=torch.contiguous_format)
                                        for t in (query, key, value))
    graphs = ptr.numel() - 1
    if num_nodes > 0 and heads > 0 and graphs > 0 and max_nodes > 0:
        grid = (graphs, triton.cdiv(max_nodes, plan.key_chunk), heads)
        with device_guard(query.device):
            _backward_kernel[grid](
                query, key, value, grad_out, ptr, index, weight, grad_query, grad_key, grad_value,
                *query.stride(), *key.stride(), *value.stride(), *grad_out.stride(),
                heads, dim, dim_v, scale, index.shape[-1], K_PAD=plan.k_pad,
                BLOCK_M=plan.query_tile, BLOCK_N=plan.key_chunk, BLOCK_D=plan.block_d,
                BLOCK_DV=plan.block_dv,
            )
    return grad_query, grad_key, grad_value


class _FusedKMIPAttention(torch.autograd.Function):
    """The fused kernels as an autograd function; index, score and weight are not differentiable."""

    @staticmethod
    def forward(ctx, query, key, value, ptr, k, max_nodes, scale, plan: AttentionPlan):
        ctx.set_materialize_grads(False)
        out, index, score, weight = triton_forward(query, key, value, ptr, k, max_nodes, scale, plan)
        ctx.save_for_backward(query, key, value, ptr, index, weight)
        ctx.max_nodes, ctx.scale, ctx.plan = max_nodes, scale, plan
        ctx.mark_non_differentiable(index, score, weight)
        return out, index, score, weight

    @staticmethod
    def backward(ctx, grad_out, _grad_index, _grad_score, _grad_weight):
        if grad_out is None:  # grads are not materialised: nothing flowed back into the output
            return None, None, None, None, None, None, None, None
        query, key, value, ptr, index, weight = ctx.saved_tensors
        grads = triton_backward(
            query, key, value, grad_out, ptr, index, weight, ctx.max_nodes, ctx.scale, ctx.plan
        )
        needs = ctx.needs_input_grad[:3]
        grads = [grad if needed else None for grad, needed in zip(grads, needs, strict=True)]
        return (*grads, None, None, None, None, None)


def _checked_plan(
    query: Tensor, key: Tensor, value: Tensor, k: int, ptr: Tensor, max_nodes: int
) -> AttentionPlan:
    """The launch plan, after shape, dtype and limit checks on host metadata only (nothing here reads
    device memory)."""
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, Tensor) or tensor.dim() != 3:
            raise ValueError(f"`{name}` must be a 3-D tensor [N, H, d]")
        if tensor.dtype not in TRITON_DTYPES:
            raise TypeError(f"`{name}` must be one of {TRITON_DTYPES}, got {tensor.dtype}")
        if tensor.dtype != query.dtype or tensor.device != query.device:
            raise TypeError(f"`{name}` must share dtype and device with `query`")
    if key.shape != query.shape or value.shape[:2] != query.shape[:2]:
        raise ValueError(
            f"`key` must be {tuple(query.shape)} and `value` [{query.shape[0]}, {query.shape[1]}, d_v], "
            f"got {tuple(key.shape)} and {tuple(value.shape)}"
        )
    if not isinstance(ptr, Tensor) or ptr.dim() != 1 or ptr.numel() < 1 or ptr.dtype != torch.long:
        raise TypeError("`ptr` must be a 1-D int64 tensor of graph offsets [G + 1]")
    if ptr.device != query.device:
        raise ValueError(f"`ptr` must be on the inputs' device {query.device}, got {ptr.device}")
    if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) or max_nodes < 0:
        raise TypeError(f"`max_nodes` must be a host int >= 0, got {max_nodes!r}")
    if max_nodes > MAX_FUSED_NODES:
        raise ValueError(f"`max_nodes` must be <= MAX_FUSED_NODES = {MAX_FUSED_NODES}, got {max_nodes}")
    if isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"`k` must be an int, got {type(k).__name__}")
    if not 1 <= k <= MAX_FUSED_K:
        raise ValueError(f"`k` must lie in [1, MAX_FUSED_K = {MAX_FUSED_K}], got {k}")
    limit = shared_memory_limit(query.device)
    plan = attention_plan(query.dtype, query.shape[-1], value.shape[-1], max_nodes, k, limit)
    if plan is None:
        raise ValueError(
            f"no launch plan of the fused kernels fits head dims {query.shape[-1]}/{value.shape[-1]} with "
            f"graphs of up to {max_nodes} nodes in the device's {limit} bytes of shared memory per block "
            "(kmip_attention takes the search path for such calls)"
        )
    return plan


def triton_kmip_attention(
    query: Tensor, key: Tensor, value: Tensor, k: int, ptr: Tensor, max_nodes: int, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    r"""k-MIP attention of graphs of at most ``MAX_FUSED_NODES`` nodes in one fused launch each way.

    .. math::
        \mathrm{out}_i = \sum_{j \in T_k(i)} \operatorname{softmax}_j(s\, q_i \cdot k_j)\, v_j

    with :math:`T_k(i)` the k keys of i's graph ranked first by (score descending, key index ascending),
    scores at float32 accuracy: what :func:`kmipgt.ops.kmip_attention` computes with ``dropout_p=0``. No
    host synchronisation on CUDA; deterministic (no atomics).

    Args:
        query: ``[N, H, d]`` (float32, float16 or bfloat16). key: ``[N, H, d]``. value: ``[N, H, d_v]``,
            all of one dtype and device.
        k: keys per query, ``1 <= k <= MAX_FUSED_K``, at most the largest graph (the caller clamps it); a
            runtime argument: the kernels compile once per power-of-two bucket of k.
        ptr: ``[G + 1]`` int64 graph offsets on the inputs' device, already valid (``ptr[0] = 0``,
            non-decreasing, ``ptr[-1] = N``); empty graphs are allowed.
        max_nodes: host integer at least the largest graph size, ``<= MAX_FUSED_NODES``; it sizes the
            grids and register blocks only.
        scale: logit scale :math:`s`.

    Returns:
        ``(out, index, score, weight)``: ``out`` ``[N, H, d_v]`` in the value dtype, differentiable with
        respect to query, key and value; ``index`` ``[N, H, k]`` int64 global key rows best first
        (``-1`` where the graph has fewer than k nodes); ``score`` ``[N, H, k]`` float32 unscaled inner
        products (``-inf`` at padding); ``weight`` ``[N, H, k]`` float32 softmax weights of
        ``scale * score`` over the selected keys (0 at padding).
    """
    plan = _checked_plan(query, key, value, k, ptr, max_nodes)
    return _FusedKMIPAttention.apply(query, key, value, ptr, k, max_nodes, float(scale), plan)
