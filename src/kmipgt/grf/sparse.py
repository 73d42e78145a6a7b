"""Sparse (values differentiable) times dense products, O(nnz) in time and memory both ways.

``torch.sparse.mm`` is not usable here: its backward with respect to the sparse values forms the dense
``[N, N]`` product ``grad @ denseᵀ`` (17 GB at N = 65k in our measurement). The gradient of the values
is a sampled dense-dense product (SDDMM) on the sparsity pattern, which
``torch.sparse.sampled_addmm`` computes in O(nnz · F). On CPU the forward product goes through
SciPy's CSR/CSC kernels, about 3x faster than torch's CPU CSR matmul on walk-feature patterns.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import scipy.sparse
import torch
from torch import Tensor

__all__ = ["CSRPattern", "csr_product", "sampled_dot", "sddmm", "sparse_dense_matmul"]


def index_dtype(largest: int) -> torch.dtype:
    """int32 for indices up to ``largest`` when they fit (half the bytes of int64), else int64."""
    return torch.int32 if largest <= torch.iinfo(torch.int32).max else torch.int64


def _crow(row: Tensor, num_rows: int) -> Tensor:
    """CSR offsets ``[num_rows + 1]`` in ``row``'s dtype: torch's CSR tensors need offsets and columns
    of one dtype (int64 when ``row`` is too long for int32 offsets)."""
    counts = torch.bincount(row, minlength=num_rows)
    dtype = row.dtype if index_dtype(row.numel()) == torch.int32 else torch.int64
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(dtype)


@dataclass(frozen=True)
class CSRPattern:
    """Sparsity pattern of a square ``[N, N]`` matrix, row-major sorted, with its CSR row offsets.

    Build it once for a fixed pattern (``from_indices``) and pass it instead of ``indices`` to skip the
    per-call offset computation.
    """

    num_nodes: int
    row: Tensor
    crow: Tensor
    col: Tensor

    @classmethod
    def from_indices(cls, indices: Tensor, num_nodes: int) -> CSRPattern:
        """From ``[2, nnz]`` int64 or int32 ``(row, col)`` sorted row-major without duplicates; the offsets
        take the indices' dtype (int64 if ``nnz`` does not fit int32: then the columns are widened too)."""
        if indices.dim() != 2 or indices.shape[0] != 2:
            raise ValueError(f"`indices` must have shape [2, nnz], got {tuple(indices.shape)}")
        row, col = indices
        crow = _crow(row, num_nodes)
        return cls(num_nodes, row, crow, col.to(crow.dtype))


def _as_pattern(indices: Tensor | CSRPattern, num_nodes: int) -> CSRPattern:
    if isinstance(indices, CSRPattern):
        if indices.num_nodes != num_nodes:
            raise ValueError(
                f"pattern is for {indices.num_nodes} nodes, the dense operand has {num_nodes} rows"
            )
        return indices
    return CSRPattern.from_indices(indices, num_nodes)


def csr_product(
    row: Tensor,
    crow: Tensor,
    col: Tensor,
    values: Tensor,
    dense: Tensor,
    shape: tuple[int, int],
    transpose: bool = False,
) -> Tensor:
    """``A @ dense`` or ``Aᵀ @ dense`` for ``A`` ``[R, C]`` given by row-major sorted ``(row, col, values)``
    with CSR offsets ``crow`` ``[R + 1]``; no autograd. Each output row of ``A @ dense`` is a sum over
    that row's entries alone, so it does not depend on the other rows given."""
    if dense.device.type == "cpu" and dense.dtype in (torch.float32, torch.float64):
        matrix = scipy.sparse.csr_matrix((values.numpy(), col.numpy(), crow.numpy()), shape=shape)
        if transpose:
            matrix = matrix.T
        return torch.from_numpy(matrix @ dense.numpy())
    # Sparse COO tensors take int64 indices only.
    indices = torch.stack([col, row] if transpose else [row, col]).long()
    size = shape[::-1] if transpose else shape
    return torch.sparse.mm(torch.sparse_coo_tensor(indices, values, size, check_invariants=False), dense)


def sddmm(crow: Tensor, col: Tensor, left: Tensor, right: Tensor, shape: tuple[int, int]) -> Tensor:
    """``[nnz]``: ``left[row_e] · right[col_e]`` for every entry of the CSR pattern ``(crow, col)`` of shape
    ``[R, C]`` (``left`` ``[R, F]``, ``right`` ``[C, F]``, contiguous), in storage order; no autograd."""
    with warnings.catch_warnings():
        # SDDMM needs the CSR layout, which torch flags as beta on every construction.
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        pattern = torch.sparse_csr_tensor(
            crow, col, left.new_zeros(col.numel()), shape, check_invariants=False
        )
        return torch.sparse.sampled_addmm(pattern, left, right.T, beta=0.0).values()


class _SampledDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, row, crow, col, left, right, shape):
        ctx.save_for_backward(row, crow, col, left, right)
        ctx.shape = shape
        return sddmm(crow, col, left.detach().contiguous(), right.detach().contiguous(), shape)

    @staticmethod
    def backward(ctx, grad):
        row, crow, col, left, right = ctx.saved_tensors
        grad = grad.contiguous()
        grad_left = grad_right = None
        if ctx.needs_input_grad[3]:
            grad_left = csr_product(row, crow, col, grad, right.detach().contiguous(), ctx.shape, False)
        if ctx.needs_input_grad[4]:
            grad_right = csr_product(row, crow, col, grad, left.detach().contiguous(), ctx.shape, True)
        return None, None, None, grad_left, grad_right, None


class _SparseDenseMatmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, row, crow, col, values, dense, shape, transpose):
        ctx.save_for_backward(row, crow, col, values, dense)
        ctx.shape, ctx.transpose = shape, transpose
        return csr_product(row, crow, col, values.detach(), dense.detach().contiguous(), shape, transpose)

    @staticmethod
    def backward(ctx, grad):
        row, crow, col, values, dense = ctx.saved_tensors
        grad = grad.contiguous()
        grad_values = grad_dense = None
        if ctx.needs_input_grad[3]:
            left, right = (dense, grad) if ctx.transpose else (grad, dense)
            grad_values = sddmm(crow, col, left, right, ctx.shape)
        if ctx.needs_input_grad[4]:
            grad_dense = csr_product(row, crow, col, values.detach(), grad, ctx.shape, not ctx.transpose)
        return None, None, None, grad_values, grad_dense, None, None


def sparse_dense_matmul(
    indices: Tensor | CSRPattern, values: Tensor, dense: Tensor, *, transpose: bool = False
) -> Tensor:
    """``A @ dense`` (or ``Aᵀ @ dense``) for square sparse ``A``, with gradients to values and dense.

    Args:
        indices: ``[2, nnz]`` int64 or int32 ``(row, col)`` sorted row-major without duplicates
            (coalesced order), or their :class:`CSRPattern`.
        values: ``[nnz]`` floating values of ``A`` (may require grad).
        dense: ``[N, F]``.
        transpose: multiply by ``Aᵀ`` instead.

    Returns:
        ``[N, F]``.
    """
    num_rows = dense.shape[0]
    pattern = _as_pattern(indices, num_rows)
    values = values.to(dense.dtype)
    shape = (num_rows, num_rows)
    return _SparseDenseMatmul.apply(pattern.row, pattern.crow, pattern.col, values, dense, shape, transpose)


def sampled_dot(indices: Tensor | CSRPattern, left: Tensor, right: Tensor) -> Tensor:
    """``[nnz]`` dot products ``left[i] · right[j]`` at the stored entries ``(i, j)`` (SDDMM).

    Args:
        indices: ``[2, nnz]`` int64 or int32 ``(i, j)`` sorted row-major without duplicates, or a
            :class:`CSRPattern`.
        left: ``[N, F]``; right: ``[N, F]``; both may require grad.

    Returns:
        ``[nnz]``, in the order of ``indices``.
    """
    num_rows = left.shape[0]
    pattern = _as_pattern(indices, num_rows)
    return _SampledDot.apply(pattern.row, pattern.crow, pattern.col, left, right, (num_rows, right.shape[0]))
