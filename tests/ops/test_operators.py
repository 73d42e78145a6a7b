"""The ``kmipgt`` torch.library operators: their schemas, fake implementations and autograd formulas agree
with their real implementations (``torch.library.opcheck``), and their autocast policy keeps the search and
the softmax at float32 accuracy."""

from __future__ import annotations

import pytest
import torch

import kmipgt.ops  # noqa: F401  (registers the operators)
from kmipgt.ops import full_attention, kmip_attention, topk_inner_product
from kmipgt.ops.gated_aggregate import gated_mean

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
OPS = torch.ops.kmipgt


def _tensors(device: str, sizes=(7, 1, 0, 30, 12), dim=5, heads=3, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    n = int(ptr[-1])
    query, key, value = (torch.randn(n, heads, dim, generator=gen).to(device, dtype) for _ in range(3))
    device_ptr = None if device == "cpu" else ptr.to(device)
    return ptr, device_ptr, query, key, value


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("backend", "dropout_p"), [("auto", 0.0), ("torch", 0.0), ("auto", 0.3)])
def test_kmip_attention_operator(device, backend, dropout_p):
    ptr, device_ptr, query, key, value = _tensors(device)
    args = (query.requires_grad_(), key.requires_grad_(), value.requires_grad_(), 4, ptr, None, device_ptr,
            None, None, 0.5, dropout_p, backend, None, None, None)
    # With dropout the outputs are random: its backward is checked against the gradient checker below.
    utils = ("test_schema", "test_faketensor", "test_aot_dispatch_dynamic") if dropout_p else None
    torch.library.opcheck(OPS.kmip_attention.default, args, **({"test_utils": utils} if utils else {}))


def test_kmip_attention_operator_with_keys_of_their_own():
    ptr, _, query, key, value = _tensors("cpu")
    key_ptr = torch.tensor([0, 3, 3, 9, 20, 24])
    key, value = key[:24], value[:24]
    args = (query, key.requires_grad_(), value.requires_grad_(), 3, ptr, key_ptr, None, None, None, 0.5,
            0.0, "auto", None, None, None)
    torch.library.opcheck(OPS.kmip_attention.default, args)


def test_a_dropout_backward_differentiates_the_forward_it_saved():
    ptr, _, query, key, value = _tensors("cpu", sizes=(5, 1, 0, 7), dim=3, heads=2, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (query, key, value)]

    def attention(*tensors):
        torch.manual_seed(3)  # the same dropout mask every call
        return kmip_attention(*tensors, 4, ptr=ptr, dropout_p=0.3)

    assert torch.autograd.gradcheck(attention, inputs)


@pytest.mark.parametrize("device", DEVICES)
def test_the_exact_search_operator(device):
    ptr, device_ptr, query, key, _ = _tensors(device)
    for backend in ("auto", "torch"):
        torch.library.opcheck(OPS.topk_inner_product.default, (query, key, 5, ptr, None, device_ptr, backend))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dropout_p", [0.0, 0.2])
def test_the_full_attention_operator(device, dropout_p):
    ptr, device_ptr, query, key, value = _tensors(device)
    seed = torch.tensor(7) if dropout_p else None
    args = (query.requires_grad_(), key.requires_grad_(), value.requires_grad_(), ptr, None, device_ptr, 0.4,
            dropout_p, seed)
    torch.library.opcheck(OPS.full_attention.default, args)


def test_full_attention_dropout_backward_replays_the_forward_masks():
    ptr, _, query, key, value = _tensors("cpu", sizes=(5, 1, 0, 7), dim=3, heads=2, dtype=torch.float64)
    inputs = [t.requires_grad_() for t in (query, key, value)]

    def attention(*tensors):
        torch.manual_seed(4)
        return full_attention(*tensors, ptr=ptr, dropout_p=0.3)

    assert torch.autograd.gradcheck(attention, inputs)


@pytest.mark.parametrize("device", DEVICES)
def test_the_gated_mean_operator(device):
    gen = torch.Generator().manual_seed(1)
    edge_index = torch.randint(0, 9, (2, 40), generator=gen).to(device)
    logits = torch.randn(40, 6, generator=gen).to(device).requires_grad_()
    messages = torch.randn(9, 6, generator=gen).to(device).requires_grad_()
    args = (logits, messages, edge_index[0], edge_index[1], 9)
    torch.library.opcheck(OPS.gated_mean.default, args)
    assert gated_mean(logits, messages, edge_index).shape == (9, 6)


def _bf16_tolerance(reference: torch.Tensor) -> dict:
    """One bfloat16 rounding of values of the reference's size: the output is rounded to bf16 once."""
    return {"rtol": 2**-7, "atol": 2**-7 * float(reference.abs().max())}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_kmip_attention_under_autocast_selects_as_float32_and_sums_in_bf16(device):
    """The search and the softmax run on float32 queries and keys: the same keys and weights as without
    autocast; the values and the sum run in bf16, the output is bf16 within one rounding of float32."""
    ptr, _, query, key, value = _tensors(device, sizes=(40, 25, 60), dim=8)
    expected, reference = kmip_attention(query, key, value, 6, ptr=ptr, return_selection=True)
    for backend in ("auto", "torch"):
        with torch.autocast(device, dtype=torch.bfloat16):
            out, selection = kmip_attention(query, key, value, 6, ptr=ptr, backend=backend,
                                            return_selection=True)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(selection.index, reference.index, rtol=0, atol=0)
        torch.testing.assert_close(selection.weight, reference.weight)
        torch.testing.assert_close(out.float(), expected, **_bf16_tolerance(expected))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_values_left_in_float32_under_autocast_are_cast(device):
    """Queries and keys from a bf16 projection, values from an identity (float32): the policy casts them."""
    ptr, _, query, key, value = _tensors(device, sizes=(40, 25), dim=8)
    expected = kmip_attention(query.bfloat16().float(), key.bfloat16().float(), value, 5, ptr=ptr)
    with torch.autocast(device, dtype=torch.bfloat16):
        out = kmip_attention(query.bfloat16(), key.bfloat16(), value, 5, ptr=ptr)
        full = full_attention(query.bfloat16(), key.bfloat16(), value, ptr=ptr)
    torch.testing.assert_close(out.float(), expected, **_bf16_tolerance(expected))
    assert full.dtype == torch.bfloat16


def test_the_search_under_autocast_ranks_by_float32_scores():
    ptr, _, query, key, _ = _tensors("cpu", sizes=(200, 150), dim=16)
    expected = topk_inner_product(query, key, 7, ptr=ptr)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for backend in ("auto", "torch"):
            scores, index = topk_inner_product(query, key, 7, ptr=ptr, backend=backend)
            torch.testing.assert_close(index, expected[1], rtol=0, atol=0)
            torch.testing.assert_close(scores, expected[0])


def test_cuda_graphs_leave_out_the_operators_that_route_on_the_host():
    """Under ``torch.compile(mode="reduce-overhead")`` inductor captures in CUDA graphs every operator that
    its partitioner finds safe, and replays it without the Python around it. The attention and search
    operators choose kernels and launch grids from the values of the CPU offsets, so a replay on another
    batch would run the first batch's launches: on the forward and the backward graph that inductor gets,
    the partitioner's test must find them unsafe, while the gated mean, whose work depends on shapes
    alone, stays captured."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.utils import is_cudagraph_unsafe_fx_node

    ptr, _, query, key, value = _tensors("cpu")
    edge_index = torch.randint(0, int(ptr[-1]), (2, 60), generator=torch.Generator().manual_seed(2))
    logits = torch.randn(60, query.shape[1] * value.shape[2], requires_grad=True)

    def loss(query, key, value, logits, ptr):
        scores, _ = topk_inner_product(query.detach(), key.detach(), 3, ptr=ptr)  # (no gradient)
        out = kmip_attention(query, key, value, 4, ptr=ptr) + full_attention(query, key, value, ptr=ptr)
        return out.sum() + scores.sum() + gated_mean(logits, out.flatten(1), edge_index).sum()

    graphs = []

    def keep(graph, _):
        graphs.append(graph)
        return make_boxed_func(graph.forward)

    torch._dynamo.reset()
    compiled = torch.compile(loss, backend=aot_autograd(fw_compiler=keep, bw_compiler=keep), fullgraph=True)
    compiled(query.requires_grad_(), key.requires_grad_(), value.requires_grad_(), logits, ptr).backward()
    nodes = [node for graph in graphs for node in graph.graph.nodes if node.op == "call_function"]
    called = {str(node.target) for node in nodes}
    unsafe = {str(node.target) for node in nodes if is_cudagraph_unsafe_fx_node(node)}
    host_routed = {f"kmipgt.{name}.default" for name in (
        "topk_inner_product", "kmip_attention", "kmip_attention_backward", "full_attention",
        "full_attention_backward")}
    assert len(graphs) == 2
    assert host_routed | {"kmipgt.gated_mean.default", "kmipgt.gated_mean_backward.default"} <= called
    assert unsafe == host_routed
