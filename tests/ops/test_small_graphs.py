"""``kmip_attention`` runs a fused small-graph kernel where one serves the call, with the same result."""

from __future__ import annotations

import pytest
import torch

import kmipgt.ops.small_graphs as small_graphs
from kmipgt.ops import kmip_attention
from kmipgt.ops.ragged import RaggedLayout


def _batch(device: str, dtype=torch.float32, sizes=(7, 1, 0, 30, 12)):
    gen = torch.Generator().manual_seed(0)
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    n = int(ptr[-1])
    tensors = [torch.randn(n, 3, 5, generator=gen).to(device, dtype).requires_grad_() for _ in range(3)]
    return ptr, tensors


def _run(tensors, k, **options):
    out, selection = kmip_attention(*tensors, k, return_selection=True, **options)
    weight = torch.linspace(-1, 1, out.numel(), device=out.device).view_as(out)
    grads = torch.autograd.grad((out.float() * weight).sum(), tensors)
    return out, selection, grads


def _assert_same(fused, reference):
    (out, selection, grads), (ref_out, ref_selection, ref_grads) = fused, reference
    torch.testing.assert_close(selection.index, ref_selection.index, rtol=0, atol=0)
    torch.testing.assert_close(selection.weight, ref_selection.weight)
    torch.testing.assert_close(selection.score, ref_selection.score)
    torch.testing.assert_close(out, ref_out)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want)


def _spy(monkeypatch) -> list:
    """Records each fused call (its device type) and lets it run."""
    calls = []
    original = small_graphs.fused_small_graph_attention

    def recording(query, *args):
        result = original(query, *args)
        calls.append(None if result is None else query.device.type)
        return result

    monkeypatch.setattr("kmipgt.ops.attention.fused_small_graph_attention", recording)
    return calls


@pytest.mark.parametrize("k", [1, 4, 40])
def test_the_fused_cpu_path_equals_search_then_softmax(k, monkeypatch):
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cpu")
    fused = _run(tensors, k, layout=RaggedLayout(ptr))
    assert calls == ["cpu"]
    _assert_same(fused, _run(tensors, k, ptr=ptr, backend="torch"))


def test_calls_no_fused_kernel_serves_take_the_search(monkeypatch):
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cpu")
    kmip_attention(*tensors, 4, ptr=ptr, dropout_p=0.2)  # dropout: never fused
    kmip_attention(*tensors, 4, ptr=ptr, backend="fused")  # a backend named: its search, then the gathers
    assert calls == []
    monkeypatch.setattr(small_graphs, "CPU_MAX_NODES", 29)  # the 30-node graph is too large
    reference = _run(tensors, 4, ptr=ptr, backend="torch")
    _assert_same(_run(tensors, 4, ptr=ptr), reference)
    ptr64, tensors64 = _batch("cpu", torch.float64)
    kmip_attention(*tensors64, 4, ptr=ptr64)
    assert calls == [None, None]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_cuda_path_equals_search_then_softmax(dtype, monkeypatch):
    calls = _spy(monkeypatch)
    ptr, tensors = _batch("cuda", dtype)
    fused = _run(tensors, 4, layout=RaggedLayout(ptr, "cuda"))
    assert calls == ["cuda"]
    _assert_same(fused, _run(tensors, 4, ptr=ptr, backend="triton"))


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
    with pytest.raises(ValueError, match="applies to backend 'ivf' only"):
        kmip_attention(*tensors, 4, ptr=ptr, recall=0.9)
