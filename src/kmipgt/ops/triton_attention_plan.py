"""Launch plans of the fused Triton k-MIP attention kernels: blocks, warps, the k bucket and shared memory.

Decided on the host from the dtype, head dims, largest graph and k, without importing Triton, so
:mod:`~kmipgt.ops.small_graphs` can route a call before a kernel is built and
:mod:`~kmipgt.ops.triton_attention` launches exactly that plan.

**k is bucketed.** The slot tensors are ``[BLOCK_M, K_PAD]`` and the forward unrolls one value gather per
slot, so ``K_PAD`` is a compile-time constant; k itself is a runtime argument. ``K_PAD`` is the next power
of two of k (:func:`k_bucket`), so a stream of batches whose k is clamped to each batch's largest graph
compiles at most 7 variants (k = 1 to 64) per graph-size bucket, not one per distinct size.

**Shared memory**, in bytes, of a forward program (``e``: bytes of an input element)::

    e * BLOCK_D * (BLOCK_M + parts * BLOCK_N)

The scores are one ``tl.dot`` of the ``[BLOCK_M, BLOCK_D]`` query block and the ``[BLOCK_D, BLOCK_N]`` block
of all the graph's keys, staged in shared memory in the input dtype. ``parts`` is 2 for float32 blocks of
64 query rows, which Hopper's wgmma reads as the high and low halves of ``tf32x3``, else 1 (half inputs,
and the mma.sync path of smaller query blocks, which splits in registers). A backward program stages
float32 ``[query tile, key chunk]`` weight and logit-gradient tiles and the rows of its two dots::

    4 * (2 * QUERY_TILE * KEY_CHUNK + KEY_CHUNK * max(BLOCK_D, BLOCK_DV))

Triton's compiler for sm_90 allocates at most these (tests/ops/test_triton_plans.py compiles the kernels
and compares). At 227 KiB (H100, H200) every forward fits except float32 at head dims above 128 with
graphs of 129 to 256 nodes, which take the search instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kmipgt.ops.search.backends.triton_search import TRITON_DTYPES
from kmipgt.ops.search.triton_plan import pow2

__all__ = ["MAX_FUSED_K", "MAX_FUSED_NODES", "AttentionPlan", "attention_plan", "k_bucket"]

# Every graph of a batch is padded to next_pow2(max_nodes) key columns, each of the k selection rounds
# passes over all of them, and a forward program holds its [16, next_pow2(max_nodes)] int32 rank tile and
# the [next_pow2(d), next_pow2(max_nodes)] key block in registers: at 256 nodes and d <= 32 ptxas (sm_90,
# 8 warps) fits a program in 128 to 248 registers a thread for k = 5 to 64 without spilling (204 already
# at 512 nodes and k = 5). So the fused path is for batches of small graphs (molecules, peptides); a
# batch with a larger graph takes the blockwise search, whose cost per key tile does not grow with it.
MAX_FUSED_NODES = 256
# The slot tensors are [BLOCK_M, K_PAD] in registers and the forward unrolls K_PAD value gathers (about
# 12 s of compilation at 64, still without spills).
MAX_FUSED_K = 64

# Elements of the [BLOCK_M, BLOCK_N] int32 rank tile of a forward program (16 to 32 registers a thread);
# at least 16 query rows all the same, the least a `tl.dot` takes.
_TILE_ELEMENTS = 4096
# A backward program owns up to this many keys of a graph (their float32 gradients stay in registers) and
# visits the graph's queries in tiles of up to _QUERY_TILE rows.
_KEY_CHUNK = 64
_QUERY_TILE = 32


def k_bucket(k: int) -> int:
    """``K_PAD``, the compile-time width of the slot tensors: the next power of two ``>= k``."""
    return pow2(k, least=1)


@dataclass(frozen=True)
class AttentionPlan:
    """Constants of the forward (``block_*``, ``warps``) and backward (``query_tile``, ``key_chunk``)
    launches; ``element_size`` is the input dtype's."""

    block_m: int
    block_n: int
    block_d: int
    block_dv: int
    k_pad: int
    warps: int
    query_tile: int
    key_chunk: int
    element_size: int

    @property
    def forward_shared_memory(self) -> int:
        """Bytes of shared memory a forward program needs (the module's formula)."""
        parts = 2 if self.element_size == 4 and self.block_m >= 64 else 1
        return self.element_size * self.block_d * (self.block_m + parts * self.block_n)

    @property
    def backward_shared_memory(self) -> int:
        """Bytes of shared memory a backward program needs (the module's formula)."""
        rows = self.key_chunk * max(self.block_d, self.block_dv)
        return 4 * (2 * self.query_tile * self.key_chunk + rows)


def attention_plan(
    dtype: torch.dtype, head_dim: int, value_dim: int, max_nodes: int, k: int, shared_memory: int
) -> AttentionPlan | None:
    """The plan of a call, or None where the fused kernels cannot serve it: another dtype, a graph over
    :data:`MAX_FUSED_NODES`, k over :data:`MAX_FUSED_K`, or a program over ``shared_memory`` bytes."""
    if dtype not in TRITON_DTYPES or max_nodes > MAX_FUSED_NODES or k > MAX_FUSED_K:
        return None
    block_n = pow2(max_nodes)
    plan = AttentionPlan(
        block_m=max(16, min(64, _TILE_ELEMENTS // block_n)),
        block_n=block_n,
        block_d=pow2(head_dim),
        block_dv=pow2(value_dim),
        k_pad=k_bucket(k),
        # 8 warps once a graph's keys (the dot operand and key-gradient rows) pass 64.
        warps=8 if block_n > 64 else 4,
        query_tile=min(_QUERY_TILE, block_n),
        key_chunk=min(_KEY_CHUNK, block_n),
        element_size=dtype.itemsize,
    )
    if max(plan.forward_shared_memory, plan.backward_shared_memory) > shared_memory:
        return None
    return plan
