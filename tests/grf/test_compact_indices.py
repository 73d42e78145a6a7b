"""int32 walk and mask-pattern indices give the results of int64 ones, bit for bit on CPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from kmipgt.grf import (
    GRFMaskPattern,
    asymmetric_masked_attention,
    grf_features,
    grf_mask,
    grf_mask_pattern,
    masked_linear_attention,
    sample_walks,
)
from kmipgt.grf.sparse import CSRPattern, index_dtype

HEADS = 2
INDEX_FIELDS = ("step", "start", "node", "pairs", "pair_index")


@pytest.fixture(scope="module")
def walks():
    gen = torch.Generator().manual_seed(0)
    n = 61
    edge_index = torch.randint(0, n, (2, 150), generator=gen)
    edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    return sample_walks(edge_index, n, num_walks=3, p_halt=0.4, max_len=4, seed=2)


def _wide_walks(walks):
    wide = {name: getattr(walks, name).long() for name in INDEX_FIELDS}
    return dataclasses.replace(walks, _head_indices={}, **wide)


def _wide_pattern(pattern):
    return GRFMaskPattern(
        pattern.num_nodes, pattern.num_features,
        *(t.long() for t in (pattern.indices, pattern.left, pattern.right, pattern.entry)),
    )


def test_walks_and_pattern_are_stored_as_int32(walks):
    assert all(getattr(walks, name).dtype == torch.int32 for name in INDEX_FIELDS)
    pattern = grf_mask_pattern(walks)
    assert all(t.dtype == torch.int32 for t in (pattern.indices, pattern.left, pattern.right, pattern.entry))
    block = pattern.block_pattern(HEADS)
    assert block.row.dtype == block.crow.dtype == block.col.dtype == torch.int32
    assert walks.head_indices(HEADS).dtype == torch.int64  # sparse COO indices must be int64


def test_int32_pattern_equals_the_int64_pattern(walks):
    narrow, wide = grf_mask_pattern(walks), grf_mask_pattern(_wide_walks(walks))
    assert torch.equal(narrow.indices.long(), _wide_pattern(narrow).indices)
    for name in ("indices", "left", "right", "entry"):
        assert torch.equal(getattr(narrow, name), getattr(wide, name).int()), name


def _inputs(n: int):
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(n, HEADS, d, generator=gen, dtype=torch.float64) for d in (4, 4, 3))
    theta = torch.randn(HEADS, 5, generator=gen, dtype=torch.float64)
    return [t.requires_grad_() for t in (q, k, v, theta)]


@pytest.mark.parametrize("form", ["explicit_mask", "two_products", "asymmetric", "mask_values"])
def test_int32_indices_give_the_outputs_and_gradients_of_int64(walks, form):
    inputs = _inputs(walks.num_nodes)
    results = []
    for w, pattern in (
        (walks, grf_mask_pattern(walks)),
        (_wide_walks(walks), _wide_pattern(grf_mask_pattern(walks))),
    ):
        q, k, v, theta = inputs
        features = grf_features(w, torch.nn.functional.softplus(theta))
        if form == "explicit_mask":
            out = masked_linear_attention(q, k, v, features, feature_map="relu", mask_pattern=pattern)
        elif form == "two_products":
            out = masked_linear_attention(q, k, v, features, feature_map="elu", global_weight=0.2)
        elif form == "asymmetric":
            out = asymmetric_masked_attention(q, k, v, features, score="softmax")
        else:
            out = grf_mask(features, pattern).to_dense()
        weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
        grads = torch.autograd.grad((out * weights).sum(), inputs, allow_unused=True)
        results.append((out.detach(), grads))
    (out, grads), (wide_out, wide_grads) = results
    assert torch.equal(out, wide_out)
    for grad, expected in zip(grads, wide_grads, strict=True):
        assert (grad is None and expected is None) or torch.equal(grad, expected)


def test_index_dtype_widens_past_int32():
    assert index_dtype(2**31 - 1) == torch.int32
    assert index_dtype(2**31) == torch.int64
    pattern = CSRPattern.from_indices(torch.tensor([[0, 0, 1], [0, 1, 1]], dtype=torch.int32), 2)
    assert pattern.crow.dtype == pattern.col.dtype == torch.int32
    assert pattern.crow.tolist() == [0, 2, 3]
