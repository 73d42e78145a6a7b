"""``kmip_attention`` runs a fused small-graph kernel where one serves the call, with the same result."""

from __future__ import annotations

import pytest
import torch

import kmipgt.ops.small_graphs as small_graphs
from kmipgt.ops import kmip_attention
from kmipgt.ops.ragged import RaggedLayout


def _batch(device: str, dtype=torch.float32, sizes=(7, 1, 0, 30, 12), dim=5):
    gen = torch.Generator().manual_seed(0)
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    n = int(ptr[-1])
    tensors = [torch.randn(n, 3, dim, generator=gen).to(device, dtype).requires_grad_() for _ in range(3)]
    return ptr, tensors


def _run(tensors, k, grad_dtype=None, **options):
    """Output, selection and the gradients of ``(out * weight).sum()``, the weights exact in ``grad_dtype``
    (default the output's), so that a float32 reference sees the output gradient a half output gets."""
    out, selection = kmip_attention(*tensors, k, return_selection=True, **options)
    weight = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
    weight = weight.to(grad_dtype or out.dtype).float()
    grads = torch.autograd.grad((out.float() * weight).sum(), tensors)
    return out, selection, grads


def _rounded_once(tensors, k, **options):
    """Search then softmax as a fused kernel computes: on float32 copies of ``tensors`` (their exact
    values), then every output and gradient rounded once to their dtype. A half reference computed in its
    own dtype rounds the weights first and sums in half: 4-5% of bf16 elements would then differ by more
    than bf16 tolerances from a kernel that sums in float32."""
    dtype = tensors[0].dtype
    leaves = [t.detach().float().requires_grad_() for t in tensors]
    out, selection, grads = _run(leaves, k, grad_dtype=dtype, backend="torch", **options)
    selection = selection._replace(score=selection.score.to(dtype))
    return out.to(dtype), selection, [grad.to(dtype) for grad in grads]


def _assert_same(fused, reference):
    """Equal selections and float32 weights; outputs and gradients within float32 tolerances, or one
    rounding apart for half types (both sides round a float32 value once: at most one ulp, 2^-7 relative
    in bfloat16, apart where their float32 sums differ in the last bits)."""
    (out, selection, grads), (ref_out, ref_selection, ref_grads) = fused, reference
    torch.testing.assert_close(selection.index, ref_selection.index, rtol=0, atol=0)
    torch.testing.assert_close(selection.weight, ref_selection.weight)
    tol = {} if out.dtype == torch.float32 else {"rtol": 2**-6, "atol": 1e-5}
    # A Triton search scores with tf32x3, the reference with a float32 matmul: equal to float32 accuracy.
    score_tol = {"rtol": 1e-5, "atol": 1e-5} if out.dtype == torch.float32 else tol
    torch.testing.assert_close(selection.score, ref_selection.score, **score_tol)
    torch.testing.assert_close(out, ref_out, **tol)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, **tol)


def _spy(monkeypatch) -> list:
    """Records each time a pass asks for a fused kernel (the forward, then the backward where one runs):
    the device type of the kernel found, or None."""
    calls = []
    original = small_graphs.fused_kernel

    def recording(query, *args):
        kernel = original(query, *args)
        calls.append(None if kernel is None else query.device.type)
        return kernel

    monkeypatch.setattr("kmipgt.ops.kmip_operator.fused_kernel", recording)
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("k", [1, 4, 40])
def test_the_fused_cpu_path_equals_search_then_softmax(k, dtype, monkeypatch):
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cpu", dtype)
    fused = _run(tensors, k, layout=RaggedLayout(ptr))
    assert calls == ["cpu", "cpu"]
    _assert_same(fused, _rounded_once(tensors, k, ptr=ptr))


def test_calls_no_fused_kernel_serves_take_the_search(monkeypatch):
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cpu")
    kmip_attention(*tensors, 4, ptr=ptr, dropout_p=0.2)  # dropout: never fused
    kmip_attention(*tensors, 4, ptr=ptr, backend="fused")  # a backend named: its search, then the gathers
    assert calls == []
    monkeypatch.setattr(small_graphs, "CPU_MAX_NODES", 29)  # the 30-node graph is too large
    _assert_same(_run(tensors, 4, ptr=ptr), _rounded_once(tensors, 4, ptr=ptr))
    ptr64, tensors64 = _batch("cpu", torch.float64)
    kmip_attention(*tensors64, 4, ptr=ptr64)
    assert calls == [None, None, None]  # forward and backward, then float64


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_the_fused_cuda_path_equals_search_then_softmax(dtype, monkeypatch):
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cuda", dtype)
    fused = _run(tensors, 4, layout=RaggedLayout(ptr, "cuda"))
    assert calls == ["cuda", "cuda"]
    _assert_same(fused, _rounded_once(tensors, 4, ptr=ptr))


@pytest.mark.cuda
@pytest.mark.requires("triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dim", [160, 256])
def test_head_dims_past_128_on_cuda_take_a_path_that_fits(dim, dtype, monkeypatch):
    """Graphs of up to 199 nodes: bfloat16 fits the fused kernels' shared memory, float32's [256, 256] key
    block does not and takes the Triton search; either way the result of search then softmax."""
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cuda", dtype, sizes=(199, 3, 120), dim=dim)
    result = _run(tensors, 5, layout=RaggedLayout(ptr, "cuda"))
    assert calls == [None if dtype == torch.float32 else "cuda"] * 2
    _assert_same(result, _rounded_once(tensors, 5, ptr=ptr))


def test_large_graphs_are_fused_only_where_every_thread_has_a_graph_and_head(monkeypatch):
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cpu")  # 4 non-empty graphs x 3 heads: 15 (graph, head) tasks with empty ones
    monkeypatch.setattr(small_graphs, "CPU_MAX_NODES", 30)
    monkeypatch.setattr(small_graphs.torch, "get_num_threads", lambda: 16)
    kmip_attention(*tensors, 4, ptr=ptr)
    monkeypatch.setattr(small_graphs.torch, "get_num_threads", lambda: 15)
    kmip_attention(*tensors, 4, ptr=ptr)
    assert calls == [None, "cpu"]


def test_options_of_the_approximate_search_are_refused_with_auto_as_before():
    ptr, tensors = _batch("cpu")
    with pytest.raises(ValueError, match="`nlist`/`nprobe` only apply"):
        kmip_attention(*tensors, 4, ptr=ptr, nprobe=2)
    with pytest.raises(ValueError, match=r"applies to backends .* only"):
        kmip_attention(*tensors, 4, ptr=ptr, recall=0.9)
