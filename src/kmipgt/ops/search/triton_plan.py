"""Launch plans of the Triton top-k search kernel: blocks, pipeline stages and the shared memory they need.

Decided on the host from the head dim, k and the device's shared-memory limit, without importing Triton,
so the search registry can route a call (:class:`~kmipgt.ops.search.registry.SearchCall`) before a kernel
is built, and the launcher launches exactly what the routing saw.

Shared memory of one program, in bytes (:meth:`SearchPlan.shared_memory`)::

    max(4 * BLOCK_D * (2 * BLOCK_M + (stages + 1) * BLOCK_N),  8 * BLOCK_M * K_PAD)

The kernel scores in float32 whatever the input dtype, with ``tf32x3`` dots, which split each operand into
a high and a low TF32 part: the query block's two ``[BLOCK_M, BLOCK_D]`` parts and the key tile's two
``[BLOCK_D, BLOCK_N]`` parts live in shared memory, and every pipeline stage past the first buffers one
more raw key tile. The final sort of the ``[BLOCK_M, K_PAD]`` int64 buffer of the k best reuses that
memory. Triton's compiler for sm_90 allocates exactly the first term for 64 × 64 blocks and less for
smaller query blocks (tests/ops/test_triton_plans.py compiles the kernel and compares).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SearchPlan", "search_plan"]

# (BLOCK_M, BLOCK_N, stages), fastest first: three stages hide the key loads best, 64-row query blocks
# amortise the k-best updates. Head dims up to 128 get the first on sm_90; 129 to 256 need 32 × 32 blocks.
_CANDIDATES = ((64, 64, 3), (64, 64, 2), (32, 32, 3), (32, 32, 2), (32, 32, 1))


def pow2(n: int, least: int = 16) -> int:
    """The smallest power of two ``>= n`` and ``>= least`` (``tl.dot`` takes no block side under 16)."""
    return max(least, 1 << (n - 1).bit_length())


@dataclass(frozen=True)
class SearchPlan:
    """Constants of one launch: query rows and key columns per tile, padded head dim and k, stages."""

    block_m: int
    block_n: int
    block_d: int
    k_pad: int
    stages: int

    @property
    def shared_memory(self) -> int:
        """Bytes of shared memory a program needs (the module's formula)."""
        operands = 4 * self.block_d * (2 * self.block_m + (self.stages + 1) * self.block_n)
        return max(operands, 8 * self.block_m * self.k_pad)


def search_plan(head_dim: int, k: int, shared_memory: int) -> SearchPlan | None:
    """The fastest plan for ``head_dim`` and ``k`` slots whose program fits in ``shared_memory`` bytes, or
    None where none does (the call then needs another backend)."""
    block_d, k_pad = pow2(head_dim), pow2(max(k, 1))
    for block_m, block_n, stages in _CANDIDATES:
        plan = SearchPlan(block_m, block_n, block_d, k_pad, stages)
        if plan.shared_memory <= shared_memory:
            return plan
    return None
