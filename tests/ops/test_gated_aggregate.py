"""gated_mean: GatedGCN's gated aggregation in edge chunks, against the autograd form it replaces."""

import pytest
import torch
from torch_geometric.utils import scatter

from kmipgt.ops import gated_aggregate
from kmipgt.ops.gated_aggregate import gated_mean


def _reference(logits, messages, edge_index, eps=1e-6):
    """The autograd form GatedGCNLayer used before (GraphGPS's): sigmoid, gather, two PyG scatters."""
    src, dst = edge_index
    gate = torch.sigmoid(logits)
    num = scatter(gate * messages[src], dst, dim=0, dim_size=messages.size(0), reduce="sum")
    den = scatter(gate, dst, dim=0, dim_size=messages.size(0), reduce="sum")
    return num / (den + eps)


def _inputs(num_nodes=23, num_edges=71, channels=5, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes - 2, (2, num_edges), generator=gen)  # two nodes get no edge
    logits = torch.randn(num_edges, channels, generator=gen, dtype=dtype, requires_grad=True)
    messages = torch.randn(num_nodes, channels, generator=gen, dtype=dtype, requires_grad=True)
    return logits, messages, edge_index


@pytest.mark.parametrize("chunk_elements", [1, 7 * 5, 1 << 20])
def test_equals_the_autograd_form_in_values_and_gradients(monkeypatch, chunk_elements):
    monkeypatch.setattr(gated_aggregate, "_CHUNK_ELEMENTS", chunk_elements)
    logits, messages, edge_index = _inputs()
    out = gated_mean(logits, messages, edge_index)
    expected = _reference(logits, messages, edge_index)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    weight = torch.randn_like(out)
    grads = torch.autograd.grad((out * weight).sum(), (logits, messages))
    expected_grads = torch.autograd.grad((expected * weight).sum(), (logits, messages))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)
    assert out[-2:].abs().max() == 0  # nodes without incoming edges


def test_gradcheck_and_int32_indices():
    logits, messages, edge_index = _inputs(num_nodes=7, num_edges=15, channels=3)
    assert torch.autograd.gradcheck(lambda s, m: gated_mean(s, m, edge_index), (logits, messages))
    torch.testing.assert_close(
        gated_mean(logits, messages, edge_index.int()), gated_mean(logits, messages, edge_index)
    )


def test_float32_matches_the_float64_result():
    logits, messages, edge_index = _inputs(num_nodes=200, num_edges=900, channels=16)
    out32 = gated_mean(logits.float(), messages.float(), edge_index)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), _reference(logits, messages, edge_index), rtol=1e-5, atol=1e-6)


def test_gated_mean_with_fewer_targets_equals_the_first_rows_of_the_full_graph():
    """``num_targets``: targets are the first rows of the sources (a partition's own nodes before its
    halo); outputs and gradients equal the full aggregation's first rows."""
    torch.manual_seed(0)
    messages = torch.randn(12, 5, dtype=torch.float64, requires_grad=True)
    edge_index = torch.randint(0, 12, (2, 40))
    logits = torch.randn(40, 5, dtype=torch.float64, requires_grad=True)
    kept = edge_index[1] < 5
    weight = torch.randn(5, 5, dtype=torch.float64)
    full = gated_mean(logits, messages, edge_index)[:5]
    pair = gated_mean(logits[kept], messages, edge_index[:, kept], num_targets=5)
    torch.testing.assert_close(pair, full)
    grads_full = torch.autograd.grad((full * weight).sum(), [logits, messages])
    grads_pair = torch.autograd.grad((pair * weight).sum(), [logits, messages])
    for got, expected in zip(grads_pair, grads_full, strict=True):  # logits of dropped edges: 0 in both
        torch.testing.assert_close(got, expected)
