"""The fused exact top-k kernel for CUDA, in Triton; imported only by the ``triton`` backend, once installed.

One program owns a block of queries of one graph and one head. It sweeps the graph's keys tile by
tile: a ``tl.dot`` gives the ``[BLOCK_M, BLOCK_N]`` scores in registers (``tf32x3``: float32 accuracy,
not the 10-bit mantissa of plain TF32), and a per-query buffer of the k best so far is updated only
while some score of the tile beats a query's current k-th best, one winner per query per round.
Scores never reach global memory. Each score is packed with its key index into one int64 whose order is
(score descending, index ascending), so the buffer, the threshold and the final sort need one compare.

Block sizes and pipeline stages come from the launch plan the routing chose
(:mod:`~kmipgt.ops.search.triton_plan`), so the kernel never asks for more shared memory than the device
has; the launch runs on the inputs' device (:func:`~kmipgt.ops.search.cuda_device.device_guard`).
``TRITON_INTERPRET=1`` runs the same kernel on CPU tensors (for testing without a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kmipgt.ops.ragged import RaggedLayout
from kmipgt.ops.search.cuda_device import device_guard
from kmipgt.ops.search.triton_plan import SearchPlan

__all__ = ["launch_topk_kernel", "positive_zero"]

# Below every packed (score, index) key: the empty slot. As constexprs the int64 extremes keep their type.
_EMPTY_SLOT = tl.constexpr(-(2**63))
_UNUSED_SLOT = tl.constexpr(2**63 - 1)


@triton.jit
def positive_zero(x):
    """``x`` with -0.0 made +0.0, so that scores of zero tie (and rank by index) whatever signed zero a
    dot returns; an explicit select after the dot, which no compiler folds into the dot's accumulator."""
    return tl.where(x == 0.0, 0.0, x)


@triton.jit
def _topk_kernel(
    query,
    key,
    out_scores,
    out_index,
    block_query_start,
    block_query_end,
    block_key_start,
    block_key_end,
    heads,
    dim,
    k,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    K_PAD: tl.constexpr,
):
    block = tl.program_id(0)
    head = tl.program_id(1)
    q_start = tl.load(block_query_start + block)
    q_end = tl.load(block_query_end + block)
    k_start = tl.load(block_key_start + block)
    k_end = tl.load(block_key_end + block)
    rows = q_start + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < q_end
    stride = heads * dim
    q = tl.load(
        query + rows[:, None].to(tl.int64) * stride + head * dim + dims[None, :],
        mask=row_ok[:, None] & (dims[None, :] < dim),
        other=0.0,
    ).to(tl.float32)
    empty = _EMPTY_SLOT
    best = tl.full((BLOCK_M, K_PAD), empty, tl.int64)
    slots = tl.arange(0, K_PAD)
    # Slots past k never hold a key: +max keeps them out of the running minimum (the threshold).
    best = tl.where(slots[None, :] < k, best, _UNUSED_SLOT)
    threshold = tl.full((BLOCK_M,), empty, tl.int64)
    for tile in range(k_start, k_end, BLOCK_N):
        cols = tile + tl.arange(0, BLOCK_N)
        col_ok = cols < k_end
        kt = tl.load(
            key + cols[None, :].to(tl.int64) * stride + head * dim + dims[:, None],
            mask=col_ok[None, :] & (dims[:, None] < dim),
            other=0.0,
        ).to(tl.float32)
        # tf32x3: three TF32 tensor-core products give float32 accuracy at twice the speed of
        # the FMA-based "ieee" dot (H100, N = 1M, d = 16: 1.9 s vs 3.8 s).
        scores = positive_zero(tl.dot(q, kt, input_precision="tf32x3"))
        # Cheap float test first, against the k-th best score as a float (-inf while the buffer
        # fills); scores are packed with their indices only in tiles with a hit.
        threshold_bits = (threshold >> 32).to(tl.int32)
        threshold_score = tl.where(
            threshold == empty,
            float("-inf"),
            tl.where(threshold_bits >= 0, threshold_bits, threshold_bits ^ 0x7FFFFFFF).to(
                tl.float32, bitcast=True
            ),
        )
        hit = (scores >= threshold_score[:, None]) & col_ok[None, :] & row_ok[:, None]
        if tl.max(hit.to(tl.int32)) > 0:
            bits = scores.to(tl.int32, bitcast=True)
            ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
            low = (4294967295 - cols.to(tl.int64))[None, :]
            packed = tl.where(hit, (ordered << 32) + low, empty)
            candidates = tl.where(packed > threshold[:, None], packed, empty)
            pending = tl.max(tl.max(candidates, axis=1), axis=0) > empty
            while pending:
                winner = tl.max(candidates, axis=1)
                position = tl.argmin(best, axis=1)
                take = (slots[None, :] == position[:, None]) & (winner > threshold)[:, None]
                best = tl.where(take, winner[:, None], best)
                threshold = tl.min(best, axis=1)
                candidates = tl.where(
                    (candidates != winner[:, None]) & (candidates > threshold[:, None]), candidates, empty
                )
                pending = tl.max(tl.max(candidates, axis=1), axis=0) > empty
    best = tl.sort(tl.where(slots[None, :] < k, best, empty), dim=1, descending=True)
    top_bits = (best >> 32).to(tl.int32)
    values = tl.where(top_bits >= 0, top_bits, top_bits ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)
    index = 4294967295 - (best & 4294967295)
    found = best != empty
    values = tl.where(found, values, float("-inf"))
    index = tl.where(found, index, -1)
    out = (rows[:, None].to(tl.int64) * heads + head) * k + slots[None, :]
    ok = row_ok[:, None] & (slots[None, :] < k)
    tl.store(out_scores + out, values, mask=ok)
    tl.store(out_index + out, index, mask=ok)


def _blocks(layout: RaggedLayout, block_m: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per query block: ``[B]`` query start/end and key start/end rows (a block never spans two graphs)."""
    ptr = layout.ptr
    sizes = ptr[1:] - ptr[:-1]
    counts = (sizes + block_m - 1) // block_m
    graph = torch.repeat_interleave(torch.arange(sizes.numel()), counts)
    first_block = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    q_start = ptr[graph] + (torch.arange(graph.numel()) - first_block) * block_m
    q_end = torch.minimum(q_start + block_m, ptr[graph + 1])
    return tuple(layout.to_device(t) for t in (q_start, q_end, ptr[graph], ptr[graph + 1]))


def launch_topk_kernel(
    query: Tensor, key: Tensor, k: int, ptr: Tensor, plan: SearchPlan, layout: RaggedLayout | None = None
) -> tuple[Tensor, Tensor]:
    """Exact top-k keys per query within its own graph; inputs already checked by the ``triton`` backend.

    Args:
        query: ``[N, H, d]`` CUDA queries (float32, float16 or bfloat16; scored at float32 accuracy).
        key: ``[N, H, d]`` keys, same dtype and device.
        k: keys per query, at most ``plan.k_pad`` (the k-best buffer stays in registers).
        ptr: ``[G + 1]`` validated CSR offsets of the graphs.
        plan: the blocks and stages of the launch (:func:`~kmipgt.ops.search.triton_plan.search_plan`).
        layout: the batch's layout (of ``ptr``), whose block tables are built once and reused; default: one
            built for this call.

    Returns:
        ``(scores, index)``: ``[N, H, k]`` descending scores (query dtype) and int64 global key indices,
        ties broken by lower index; ``-inf``/``-1`` beyond a graph's size.
    """
    num_nodes, heads, dim = query.shape
    scores = torch.full((num_nodes, heads, k), float("-inf"), device=query.device)
    index = torch.full((num_nodes, heads, k), -1, dtype=torch.long, device=query.device)
    if layout is None:
        layout = RaggedLayout(ptr.cpu().long(), query.device)
    q_start, q_end, k_start, k_end = layout.derived(
        f"triton_search_blocks_{plan.block_m}", lambda layout: _blocks(layout, plan.block_m)
    )
    if q_start.numel() == 0 or k == 0:
        return scores.to(query.dtype), index
    with device_guard(query.device):
        _topk_kernel[(q_start.numel(), heads)](
            query.detach().contiguous(),
            key.detach().contiguous(),
            scores,
            index,
            q_start,
            q_end,
            k_start,
            k_end,
            heads,
            dim,
            k,
            BLOCK_M=plan.block_m,
            BLOCK_N=plan.block_n,
            BLOCK_D=plan.block_d,
            K_PAD=plan.k_pad,
            num_stages=plan.stages,
        )
    return scores.to(query.dtype), index
