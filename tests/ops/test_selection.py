"""The attention selection the ops return for inspection, against dense references."""

import itertools

import numpy as np
import pytest
import torch

import kmipgt.ops.full_softmax as full_softmax_ops
from kmipgt.ops import full_attention_topk, kmip_attention
from reference import reference_topk

SIZES = [9, 0, 25, 1, 14]


def _inputs(sizes, heads=2, dim=5, seed=0):
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    ptr = torch.tensor([0, *np.cumsum(sizes).tolist()])
    return (*(torch.randn(n, heads, dim, generator=gen, dtype=torch.float64) for _ in range(3)), ptr)


def _dense_softmax(query, key, ptr):
    """Per graph and head, the full softmax matrix of scaled scores, as a dict (graph start) -> [H, n, n]."""
    scale = query.shape[-1] ** -0.5
    out = {}
    for start, end in itertools.pairwise(ptr.tolist()):
        if end > start:
            q, k = query[start:end].transpose(0, 1), key[start:end].transpose(0, 1)
            out[start] = torch.softmax(scale * q @ k.transpose(1, 2), dim=-1)
    return out


@pytest.mark.parametrize("k", [1, 4, 30])
def test_return_selection_is_the_forward_search_and_softmax(k):
    query, key, value, ptr = (t.requires_grad_() if t.dtype.is_floating_point else t for t in _inputs(SIZES))
    out, selection = kmip_attention(query, key, value, k, ptr=ptr, return_selection=True)
    plain = kmip_attention(query, key, value, k, ptr=ptr)
    torch.testing.assert_close(out, plain)

    ref_scores, ref_index = reference_topk(query, key, k, ptr.tolist())
    width = selection.index.shape[-1]
    assert width == min(k, max(SIZES))
    np.testing.assert_array_equal(selection.index.numpy(), ref_index[..., :width])
    np.testing.assert_allclose(selection.score.detach().numpy(), ref_scores[..., :width], rtol=1e-12)
    valid = selection.index >= 0
    logits = torch.from_numpy(ref_scores[..., :width]) * query.shape[-1] ** -0.5
    expected = torch.softmax(logits, dim=-1).nan_to_num(0.0)  # rows of the empty graph stay empty
    torch.testing.assert_close(selection.weight, expected)
    assert (selection.weight[~valid] == 0).all() and selection.mass is None

    # Gradients do not depend on whether the selection is returned.
    grads = torch.autograd.grad(out.sum(), (query, key, value))
    torch.testing.assert_close(grads, torch.autograd.grad(plain.sum(), (query, key, value)))


@pytest.mark.parametrize("k", [1, 3, 30])
def test_full_attention_topk_is_the_largest_full_softmax_weights(k, monkeypatch):
    # Tiny score tiles, so the tiled log-sum-exp and the masks between graphs are exercised.
    monkeypatch.setattr(full_softmax_ops, "_LSE_TILE_ELEMENTS", 16)
    monkeypatch.setattr(full_softmax_ops, "_LSE_KEY_TILE", 4)
    query, key, _, ptr = _inputs(SIZES, seed=1)
    selection = full_attention_topk(query, key, k, ptr=ptr)
    dense = _dense_softmax(query, key, ptr)
    for start, end in itertools.pairwise(ptr.tolist()):
        for row, h in itertools.product(range(start, end), range(query.shape[1])):
            weights = dense[start][h, row - start]
            top = torch.argsort(-weights, stable=True)[: min(k, end - start)]
            index = selection.index[row, h]
            np.testing.assert_array_equal(index[index >= 0].numpy(), (top + start).numpy())
            kept = weights[top]
            torch.testing.assert_close(selection.mass[row, h], kept.sum())
            torch.testing.assert_close(selection.weight[row, h, : top.numel()], kept / kept.sum())
            torch.testing.assert_close(
                selection.score[row, h, : top.numel()], query[row, h] @ key[top + start, h].T
            )
    if k >= max(SIZES):  # every key kept: the whole softmax
        torch.testing.assert_close(selection.mass, torch.ones_like(selection.mass))
