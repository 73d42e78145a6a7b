"""A kernel that applies ``positive_zero`` alone, for tests/ops/test_triton_attention.py (imported only where
triton is). Kept at a module's top level: Triton from 3.7 reads a kernel's source from its first line that
starts with ``def``, which an indented definition has not."""

import triton
import triton.language as tl

from kmipgt.ops.search.triton_kernel import positive_zero


@triton.jit
def positive_zero_kernel(x, out, n, BLOCK: tl.constexpr):
    at = tl.arange(0, BLOCK)
    tl.store(out + at, positive_zero(tl.load(x + at, mask=at < n)), mask=at < n)
