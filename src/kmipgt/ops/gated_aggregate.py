"""GatedGCN's gated mean over incoming edges, in edge chunks, saving no ``[E, C]`` tensor of its own.

Written with autograd ops, ``sigmoid``, the gather ``Bh[src]``, their product and two scatters each keep
or allocate an ``[E, C]`` tensor (the gate and the gathered messages are saved for backward), which made
GatedGCN the largest consumer of training memory on road graphs (docs/scaling.md). Here the gate is
recomputed from the gate logits, which the caller keeps anyway (its edge BatchNorm saves them), and every
``[E, C]`` intermediate lives for one chunk of edges only. The chunk loops run inside ``torch.library``
operators (``torch.ops.kmipgt.gated_mean`` and its backward), so a compiled model sees one operator each.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["GATE_EPS", "gated_mean"]

# Added to each node's gate sum, as GraphGPS's GatedGCN does. A constant of the operator, not an argument:
# TorchDynamo traces a float argument as a symbolic input, which an activation-checkpointed region cannot
# take (tracing fails).
GATE_EPS = 1e-6

# Edge rows per chunk are chosen so that one chunk's [rows, C] temporaries stay near this many elements.
_CHUNK_ELEMENTS = 1 << 20


def _chunks(num_edges: int, channels: int):
    step = max(1, _CHUNK_ELEMENTS // max(1, channels))
    for start in range(0, num_edges, step):
        yield slice(start, min(start + step, num_edges))


@torch.library.custom_op("kmipgt::gated_mean", mutates_args=())
def _gated_mean_op(
    logits: Tensor, messages: Tensor, src: Tensor, dst: Tensor, num_targets: int
) -> tuple[Tensor, Tensor]:
    """The gated mean ``[num_targets, C]`` and the gate sums plus :data:`GATE_EPS` it divided by (for the
    backward)."""
    dtype = torch.promote_types(logits.dtype, messages.dtype)
    num = torch.zeros((num_targets, messages.shape[1]), dtype=dtype, device=messages.device)
    den = torch.zeros_like(num)
    for rows in _chunks(logits.shape[0], logits.shape[1]):
        gate = torch.sigmoid(logits[rows]).to(dtype)
        den.index_add_(0, dst[rows], gate)
        num.index_add_(0, dst[rows], gate.mul_(messages[src[rows]]))
    den += GATE_EPS
    return num.div_(den), den


@_gated_mean_op.register_fake
def _(logits, messages, src, dst, num_targets):
    dtype = torch.promote_types(logits.dtype, messages.dtype)
    out = messages.new_empty((num_targets, messages.shape[1]), dtype=dtype)
    return out, torch.empty_like(out)


@torch.library.custom_op("kmipgt::gated_mean_backward", mutates_args=())
def _gated_mean_backward_op(
    grad_out: Tensor, logits: Tensor, messages: Tensor, src: Tensor, dst: Tensor, den: Tensor, out: Tensor
) -> tuple[Tensor, Tensor]:
    """Gradients of the gated mean with respect to ``logits`` and ``messages``, the gate recomputed."""
    # out = num / den: d out / d num = 1 / den, d out / d den = -out / den.
    grad_num = grad_out / den
    grad_den = -grad_num * out
    grad_logits = torch.empty_like(logits)
    grad_messages = torch.zeros(messages.shape, dtype=grad_num.dtype, device=grad_num.device)
    for rows in _chunks(logits.shape[0], logits.shape[1]):
        gate = torch.sigmoid(logits[rows]).to(grad_num.dtype)
        grad_num_edge = grad_num[dst[rows]]
        grad_gate = grad_num_edge * messages[src[rows]] + grad_den[dst[rows]]
        grad_logits[rows] = grad_gate * gate * (1 - gate)
        grad_messages.index_add_(0, src[rows], grad_num_edge.mul_(gate))
    return grad_logits, grad_messages.to(messages.dtype)


@_gated_mean_backward_op.register_fake
def _(grad_out, logits, messages, src, dst, den, out):
    return torch.empty_like(logits), torch.empty_like(messages)


def _save_gated_mean(ctx, inputs, output) -> None:
    logits, messages, src, dst, _ = inputs
    out, den = output
    ctx.save_for_backward(logits, messages, src, dst, den, out)


def _gated_mean_grads(ctx, grad_out, _grad_den):
    grads = torch.ops.kmipgt.gated_mean_backward(grad_out, *ctx.saved_tensors)
    return (*grads, None, None, None)


_gated_mean_op.register_autograd(_gated_mean_grads, setup_context=_save_gated_mean)


def gated_mean(
    logits: Tensor, messages: Tensor, edge_index: Tensor, num_targets: int | None = None
) -> Tensor:
    r"""``out_i = Σ_{j→i} σ(s_ji) ⊙ m_j / (Σ_{j→i} σ(s_ji) + ε)``, GatedGCN's aggregation, with
    ``ε`` :data:`GATE_EPS` (a node without incoming edges gets 0).

    Args:
        logits: ``[E, C]`` gate logits :math:`s` per edge of ``edge_index``.
        messages: ``[N, C]`` per-node messages :math:`m` (gathered at each edge's source).
        edge_index: ``[2, E]`` (source, target), any integer dtype.
        num_targets: rows of the output ``N_dst`` (default ``N``): fewer where the targets are the first
            ``N_dst`` of the sources, as on a graph partition whose sources are its own nodes then a halo.

    Returns:
        ``[N_dst, C]`` in the promoted dtype of ``logits`` and ``messages``. Gradients reach both; memory
        beyond the inputs and output is ``O(N·C)`` plus one chunk of edges.
    """
    src, dst = edge_index
    rows = messages.shape[0] if num_targets is None else num_targets
    return torch.ops.kmipgt.gated_mean(logits, messages, src, dst, rows)[0]
