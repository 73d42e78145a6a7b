"""Chunked GRF kernels equal their one-chunk run bit for bit, and dense references up to rounding."""

from __future__ import annotations

import pytest
import torch

from kmipgt.grf import (
    apply_feature_map,
    asymmetric_masked_attention,
    block_mask,
    grf_feature_values,
    grf_features,
    grf_mask_pattern,
    masked_linear_attention,
    sample_walks,
)
from kmipgt.grf.edge_sums import (
    normalised_kernel_attention,
    normalised_kernel_attention_rows,
    weighted_kernel_sums,
)
from kmipgt.grf.features import feature_values, grf_mask_values

HEADS = 3
# Chunk sizes that split rows or products unevenly, plus one chunk holding everything.
CHUNKS = [1, 7, 64, 10**9]


@pytest.fixture(scope="module")
def walks():
    gen = torch.Generator().manual_seed(0)
    n = 157  # prime: no chunk size above 1 divides it
    edge_index = torch.randint(0, n, (2, 500), generator=gen)
    edge_index = torch.cat([edge_index, edge_index.flip(0)], dim=1)
    return sample_walks(edge_index, n, num_walks=3, p_halt=0.4, max_len=4, seed=1)


def _inputs(n: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, HEADS, d, generator=gen, dtype=dtype) for d in (5, 5, 4))
    theta = torch.randn(HEADS, 5, generator=gen, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, theta)]


def _value_and_grads(fn, inputs):
    out = fn(*inputs)
    weights = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * weights).sum(), inputs)
    return out.detach(), grads


def _assert_all_equal(results):
    reference_out, reference_grads = results[-1]
    for out, grads in results[:-1]:
        assert torch.equal(out, reference_out)
        for grad, expected in zip(grads, reference_grads, strict=True):
            assert torch.equal(grad, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_weighted_kernel_sums_chunks_equal_one_chunk_and_dense(walks, dtype):
    pattern = grf_mask_pattern(walks).block_pattern(HEADS)
    rows = pattern.num_nodes
    gen = torch.Generator().manual_seed(2)
    inputs = [
        torch.rand(pattern.col.numel(), generator=gen, dtype=dtype),
        torch.randn(rows, 6, generator=gen, dtype=dtype),
        torch.randn(rows, 6, generator=gen, dtype=dtype),
        torch.randn(rows, 4, generator=gen, dtype=dtype),
    ]
    inputs = [t.requires_grad_() for t in inputs]

    def sums(size):
        return lambda w, a, b, c: weighted_kernel_sums(pattern, w, a, b, c, chunk_rows=size)

    results = [_value_and_grads(sums(size), inputs) for size in CHUNKS]
    _assert_all_equal(results)

    def dense(w, a, b, c):
        mask = torch.zeros(rows, rows, dtype=dtype).index_put((pattern.row, pattern.col), w)
        return (mask * (a @ b.T)) @ c

    expected_out, expected_grads = _value_and_grads(dense, inputs)
    torch.testing.assert_close(results[0][0], expected_out)
    for grad, expected in zip(results[0][1], expected_grads, strict=True):
        torch.testing.assert_close(grad, expected)


@pytest.mark.parametrize("chunk_size", [1, 5, 1000])
def test_mask_values_chunks_equal_one_chunk_and_dense_product(walks, chunk_size):
    pattern = grf_mask_pattern(walks)
    gen = torch.Generator().manual_seed(3)
    f = torch.rand(HEADS, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    values = feature_values(grf_features(walks, f), pattern)

    def mask(size):
        return lambda v: grf_mask_values(v, pattern, chunk_size=size)

    results = [_value_and_grads(mask(size), [values]) for size in (chunk_size, 10**9)]
    _assert_all_equal(results)
    phi = grf_features(walks, f).to_dense()
    dense = (phi @ phi.transpose(1, 2))[:, pattern.indices[0], pattern.indices[1]]
    torch.testing.assert_close(results[0][0], dense.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("form", ["explicit_mask", "asymmetric"])
@pytest.mark.parametrize("feature_map", ["relu", "elu"])
@pytest.mark.parametrize("global_weight", [0.0, 0.3])
def test_attention_chunks_equal_one_chunk_and_dense(walks, dtype, form, feature_map, global_weight):
    n = walks.num_nodes
    pattern = grf_mask_pattern(walks)
    inputs = _inputs(n, dtype)

    def attention(chunk_rows):
        def run(q, k, v, theta):
            features = grf_features(walks, torch.nn.functional.softplus(theta))
            options = {"global_weight": global_weight, "chunk_rows": chunk_rows}
            if form == "asymmetric":
                return asymmetric_masked_attention(q, k, v, features, score=feature_map, **options)
            return masked_linear_attention(
                q, k, v, features, feature_map=feature_map, mask_pattern=pattern, **options
            )

        return run

    results = [_value_and_grads(attention(size), inputs) for size in [None, *CHUNKS]]
    _assert_all_equal(results)

    def dense(q, k, v, theta):
        phi = grf_features(walks, torch.nn.functional.softplus(theta)).to_dense()
        mask = (phi if form == "asymmetric" else phi @ phi.transpose(1, 2)) + global_weight
        phi_q, phi_k = apply_feature_map(q, feature_map), apply_feature_map(k, feature_map)
        kernel = torch.einsum("ihm,jhm->hij", phi_q, phi_k) * mask
        return torch.einsum("hij,jhe->ihe", kernel, v) / (kernel.sum(-1).T[..., None] + 1e-6)

    expected_out, expected_grads = _value_and_grads(dense, inputs)
    tolerance = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(results[0][0], expected_out, **tolerance)
    for grad, expected in zip(results[0][1], expected_grads, strict=True):
        torch.testing.assert_close(grad, expected, **tolerance)


def test_bad_chunk_sizes_are_rejected(walks):
    pattern = grf_mask_pattern(walks)
    block = pattern.block_pattern(1)
    x = torch.randn(walks.num_nodes, 2)
    with pytest.raises(ValueError, match="chunk_rows"):
        weighted_kernel_sums(block, torch.ones(block.col.numel()), x, x, x, chunk_rows=0)
    with pytest.raises(ValueError, match="feature_map"):
        normalised_kernel_attention(block, torch.ones(block.col.numel()), x[:, None], x, x, "elu", eps=0.0)
    values = feature_values(grf_features(walks, torch.rand(5)), pattern)
    with pytest.raises(ValueError, match="chunk_size"):
        grf_mask_values(values, pattern, chunk_size=0)


def test_relu_features_leave_the_inputs_untouched(walks):
    """The ReLU map runs in place on a head-major copy; with one head that copy must still be a copy."""
    n = walks.num_nodes
    q, k, v = (torch.randn(n, 1, 4) for _ in range(3))
    saved = q.clone(), k.clone()
    masked_linear_attention(q, k, v, grf_features(walks, torch.rand(5)), mask_pattern=grf_mask_pattern(walks))
    assert torch.equal(q, saved[0]) and torch.equal(k, saved[1])


@pytest.mark.parametrize("chunk_rows", CHUNKS)
def test_rows_of_normalised_attention_equal_the_whole_call_bit_for_bit_whatever_the_chunks(walks, chunk_rows):
    n = walks.num_nodes
    q, k, v, theta = (t.detach() for t in _inputs(n, torch.float32))
    values = grf_feature_values(walks, torch.nn.functional.softplus(theta))
    block, weights = block_mask(values, grf_mask_pattern(walks), HEADS)
    phi_k = torch.relu(k).transpose(0, 1).reshape(HEADS * n, -1)
    value1 = torch.nn.functional.pad(v, (0, 1), value=1.0).transpose(0, 1).reshape(HEADS * n, -1)
    whole = normalised_kernel_attention(block, weights, q, phi_k, value1, "relu", eps=1e-6)
    rows = [
        normalised_kernel_attention_rows(
            block, weights, q[start : start + chunk_rows], phi_k, value1, start, eps=1e-6
        )
        for start in range(0, n, chunk_rows)
    ]
    assert torch.equal(torch.cat(rows), whole)


def test_rows_outside_the_pattern_are_rejected(walks):
    n = walks.num_nodes
    block, weights = block_mask(torch.rand(1, walks.nnz), grf_mask_pattern(walks), HEADS)
    phi_k, value1 = torch.rand(HEADS * n, 4), torch.rand(HEADS * n, 5)

    def rows(query, start, keys=phi_k):
        return normalised_kernel_attention_rows(block, weights, query, keys, value1, start, eps=0.0)

    with pytest.raises(ValueError, match="do not lie in a pattern"):
        rows(torch.rand(8, HEADS, 4), n - 4)
    with pytest.raises(ValueError, match="do not lie in a pattern"):
        rows(torch.rand(8, HEADS + 1, 4), 0)
    with pytest.raises(ValueError, match="pattern's"):
        rows(torch.rand(8, HEADS, 4), 0, phi_k[1:])
