import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kmipgt.ops import full_attention, kmip_attention
from reference import reference_attention


def _inputs(sizes, heads=2, dim=5, dim_v=3, seed=0, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    n = sum(sizes)
    ptr = torch.tensor([0, *np.cumsum(sizes).tolist()])
    tensors = [
        torch.randn(n, heads, d, generator=gen, dtype=dtype, requires_grad=True) for d in (dim, dim, dim_v)
    ]
    return (*tensors, ptr)


def _per_graph_sdpa(query, key, value, ptr):
    outs = []
    for start, end in zip(ptr[:-1].tolist(), ptr[1:].tolist()):
        if end > start:
            q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
            outs.append(F.scaled_dot_product_attention(q, k, v).transpose(0, 1))
    return torch.cat(outs)


@pytest.mark.parametrize("sizes", [[40], [9, 0, 25, 1, 14], [700, 3]])
@pytest.mark.parametrize("k", [1, 4, 30])
def test_kmip_matches_dense_masked_softmax(sizes, k):
    query, key, value, ptr = _inputs(sizes)
    out = kmip_attention(query, key, value, k, ptr=ptr)
    ref = reference_attention(query, key, value, k, ptr.tolist())
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)


def test_gradients_match_dense_reference():
    query, key, value, ptr = _inputs([12, 30, 7])
    grad_out = torch.randn(49, 2, 3, dtype=torch.float64)
    out = kmip_attention(query, key, value, 5, ptr=ptr, scale=0.7)
    ref = reference_attention(query, key, value, 5, ptr.tolist(), scale=0.7)
    grads = torch.autograd.grad(out, (query, key, value), grad_out)
    ref_grads = torch.autograd.grad(ref, (query, key, value), grad_out)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-10)


def test_gradcheck():
    query, key, value, ptr = _inputs([6, 9], heads=2, dim=3, dim_v=2)
    assert torch.autograd.gradcheck(
        lambda q, k, v: kmip_attention(q, k, v, 3, ptr=ptr), (query, key, value), fast_mode=True
    )


def test_k_at_least_graph_size_is_full_attention():
    query, key, value, ptr = _inputs([17, 1, 40, 600])
    out = kmip_attention(query, key, value, 600, ptr=ptr)
    torch.testing.assert_close(out, _per_graph_sdpa(query, key, value, ptr), rtol=1e-10, atol=1e-10)


def test_full_attention_matches_per_graph_sdpa():
    query, key, value, ptr = _inputs([3, 0, 200, 11, 900])
    out = full_attention(query, key, value, ptr=ptr)
    ref = _per_graph_sdpa(query, key, value, ptr)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad(out.sum(), (query, key, value))
    ref_grads = torch.autograd.grad(ref.sum(), (query, key, value))
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-10)


def test_changing_one_graph_leaves_others_unchanged():
    query, key, value, ptr = _inputs([15, 22, 18])
    before = kmip_attention(query, key, value, 4, ptr=ptr).detach()
    with torch.no_grad():
        key[15:37] *= -3.0
        value[15:37] += 10.0
    after = kmip_attention(query, key, value, 4, ptr=ptr).detach()
    assert torch.equal(before[:15], after[:15]) and torch.equal(before[37:], after[37:])
    assert not torch.allclose(before[15:37], after[15:37])


def test_dropout_zeroes_and_rescales_attention_weights():
    # One-hot values read the attention weights back out: out[i, h, j] = weight of key j.
    n, p = 30, 0.4
    gen = torch.Generator().manual_seed(3)
    query, key = torch.randn(n, 1, 4, generator=gen), torch.randn(n, 1, 4, generator=gen)
    value = torch.eye(n)[:, None, :]
    clean = kmip_attention(query, key, value, 6)
    torch.manual_seed(0)
    dropped = kmip_attention(query, key, value, 6, dropout_p=p)
    kept = dropped != 0
    assert 0 < kept.sum() < (clean != 0).sum()
    torch.testing.assert_close(dropped[kept], clean[kept] / (1 - p))
    assert ((clean == 0) <= ~kept).all()


def test_dropout_gradcheck_with_fixed_mask():
    query, key, value, ptr = _inputs([8, 5], dim=3, dim_v=2)

    def attention(q, k, v):
        torch.manual_seed(11)
        return kmip_attention(q, k, v, 4, ptr=ptr, dropout_p=0.3)

    assert torch.autograd.gradcheck(attention, (query, key, value), fast_mode=True)


def test_saved_for_backward_is_linear_not_gathered():
    n, heads, dim, k = 400, 2, 16, 8
    query, key, value, _ = _inputs([n], heads=heads, dim=dim, dim_v=dim, dtype=torch.float32)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t.numel()) or t, lambda t: t):
        kmip_attention(query, key, value, k)
    inputs = n * heads * dim
    # Inputs are saved by reference; everything else must be O(N·H·k), never the [N, H, k, d] gathers.
    extra = [numel for numel in saved if numel != inputs]
    assert extra and max(extra) <= n * heads * k


def test_bf16_inputs_use_float32_softmax():
    # k = N so the selection cannot differ; what is left is the precision of the softmax and sums.
    query, key, value, _ = _inputs([50], dtype=torch.float32)
    rounded = [t.detach().bfloat16() for t in (query, key, value)]
    out = kmip_attention(*rounded, 50)
    ref = _per_graph_sdpa(*(t.float() for t in rounded), torch.tensor([0, 50]))
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"value": torch.randn(6, 2, 3)}, ValueError, "`value` must have shape"),
        ({"value": torch.ones(5, 2, 3, dtype=torch.int32)}, TypeError, "`value` must be a floating"),
        ({"dropout_p": 1.0}, ValueError, "`dropout_p`"),
        ({"dropout_p": -0.1}, ValueError, "`dropout_p`"),
        ({"scale": "big"}, TypeError, "`scale`"),
        ({"k": 0}, ValueError, "`k` must be >= 1"),
    ],
)
def test_bad_input(kwargs, error, match):
    args = {"query": torch.randn(5, 2, 4), "key": torch.randn(5, 2, 4), "value": torch.randn(5, 2, 3), "k": 2}
    args.update(kwargs)
    with pytest.raises(error, match=match):
        kmip_attention(args.pop("query"), args.pop("key"), args.pop("value"), args.pop("k"), **args)


@pytest.mark.cuda
@pytest.mark.cuda
def test_cuda_matches_cpu_forward_and_backward():
    query, key, value, ptr = _inputs([300, 7, 1500], dtype=torch.float32)
    cpu_out = kmip_attention(query, key, value, 16, ptr=ptr)
    cpu_grads = torch.autograd.grad(cpu_out.sum(), (query, key, value))
    cuda_inputs = [t.detach().cuda().requires_grad_() for t in (query, key, value)]
    gpu_out = kmip_attention(*cuda_inputs, 16, ptr=ptr.cuda())
    gpu_grads = torch.autograd.grad(gpu_out.sum(), cuda_inputs)
    torch.testing.assert_close(gpu_out.cpu(), cpu_out, rtol=1e-4, atol=1e-4)
    for gpu_grad, cpu_grad in zip(gpu_grads, cpu_grads):
        torch.testing.assert_close(gpu_grad.cpu(), cpu_grad, rtol=1e-3, atol=1e-3)
