"""The batch layout built once per forward: validation, lazily read host facts, and attention functions taking
it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kmipgt.ops import full_attention, kmip_attention
from kmipgt.ops.full_softmax import _size_buckets
from kmipgt.ops.ragged import RaggedLayout, batch_layout


def _per_graph_sdpa(query, key, value, sizes):
    """Reference: SDPA on each graph alone (``[n, H, d]`` -> ``[1, H, n, d]``)."""
    outputs, start = [], 0
    for size in sizes:
        rows = slice(start, start + size)
        q, k, v = (t[rows].transpose(0, 1)[None] for t in (query, key, value))
        outputs.append(F.scaled_dot_product_attention(q, k, v)[0].transpose(0, 1))
        start += size
    return torch.cat(outputs)


def test_layout_holds_the_host_facts_of_its_batch():
    ptr = torch.tensor([0, 3, 3, 10, 12])
    layout = RaggedLayout.from_ptr(12, ptr=ptr)
    assert (layout.num_nodes, layout.num_graphs, layout.max_nodes) == (12, 4, 7)
    graph, position = layout.node_graph_position()
    assert graph.tolist() == [0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 3, 3]
    assert position.tolist() == [0, 1, 2, 0, 1, 2, 3, 4, 5, 6, 0, 1]
    with pytest.raises(ValueError, match="must end at the number of nodes"):
        RaggedLayout.from_ptr(11, ptr=ptr)


def test_a_forward_builds_its_layout_from_ptr_else_batch_else_none():
    ptr, batch = torch.tensor([0, 2, 5]), torch.tensor([0, 0, 1, 1, 1])
    assert batch_layout(5, torch.device("cpu")) is None
    for layout in (batch_layout(5, torch.device("cpu"), ptr=ptr),
                   batch_layout(5, torch.device("cpu"), batch=batch)):
        assert layout.ptr.tolist() == [0, 2, 5] and layout.num_graphs == 2 and layout.max_nodes == 3
    with pytest.raises(ValueError, match="must end at the number of nodes"):
        batch_layout(6, torch.device("cpu"), ptr=ptr)


def test_building_a_layout_reads_no_offsets():
    """A compiled model builds its layout from a ptr input: the host facts wait for their first use."""
    layout = RaggedLayout(torch.tensor([0, 2, 5]), device="meta")
    assert layout.num_graphs == 2 and layout._derived == {}
    assert (layout.num_nodes, layout.max_nodes) == (5, 3)
    device_ptr = torch.empty(3, dtype=torch.long, device="meta")
    assert RaggedLayout(torch.tensor([0, 2, 5]), device_ptr=device_ptr).device_ptr is device_ptr
    with pytest.raises(ValueError, match="`device_ptr` must be the \\[3\\] offsets on meta"):
        RaggedLayout(torch.tensor([0, 2, 5]), device="meta", device_ptr=torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("sizes", [[5, 9, 7, 9], [1, 40, 2, 3, 0, 17, 64, 1]])
def test_full_attention_over_padded_size_buckets_equals_sdpa_per_graph(sizes):
    gen = torch.Generator().manual_seed(0)
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    n = int(ptr[-1])
    query, key, value = (torch.randn(n, 2, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    expected = _per_graph_sdpa(query, key, value, sizes)
    layout = RaggedLayout(ptr)
    for out in (full_attention(query, key, value, ptr=ptr), full_attention(query, key, value, layout=layout)):
        torch.testing.assert_close(out, expected)
    if len(sizes) > 4:  # sizes 1 to 64: more than one bucket
        assert len(_size_buckets(layout)) > 1


def test_full_attention_gradients_through_the_padding_equal_per_graph_sdpa():
    gen = torch.Generator().manual_seed(1)
    sizes = [3, 11, 6]
    ptr = torch.tensor([0, *sizes]).cumsum(0)
    inputs = [torch.randn(20, 2, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    weight = torch.randn(20, 2, 3, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((full_attention(*inputs, ptr=ptr) * weight).sum(), inputs)
    expected = torch.autograd.grad((_per_graph_sdpa(*inputs, sizes) * weight).sum(), inputs)
    for got, want in zip(grads, expected):
        torch.testing.assert_close(got, want)


def test_kmip_attention_with_a_layout_equals_it_with_ptr():
    gen = torch.Generator().manual_seed(2)
    ptr = torch.tensor([0, 30, 31, 31, 80])
    query, key, value = (torch.randn(80, 3, 8, generator=gen) for _ in range(3))
    expected = kmip_attention(query, key, value, 6, ptr=ptr)
    layout = RaggedLayout(ptr)
    torch.testing.assert_close(kmip_attention(query, key, value, 6, layout=layout), expected)
    with pytest.raises(ValueError, match="either `layout` or"):
        kmip_attention(query, key, value, 6, layout=layout, ptr=ptr)
    with pytest.raises(ValueError, match="`layout` holds 80 nodes"):
        kmip_attention(query[:10], key[:10], value[:10], 6, layout=layout)


def test_a_layout_is_checked_against_the_inputs_it_describes():
    with pytest.raises(ValueError, match="int64 CPU offsets"):
        RaggedLayout(torch.tensor([0, 2], dtype=torch.int32))
    layout = RaggedLayout(torch.tensor([0, 4]), device="meta")
    tensors = [torch.randn(4, 1, 2) for _ in range(3)]
    with pytest.raises(ValueError, match="`layout` is for meta"):
        kmip_attention(*tensors, 2, layout=layout)
