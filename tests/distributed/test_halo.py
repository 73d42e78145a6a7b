"""Halo exchange on 2 gloo ranks: a two-layer PyG model on each rank's nodes plus its one-hop halo gives
the rows and gradients of the same model run on the whole graph in one process."""

import pytest
import torch

from halo_cases import OFFSETS, graph_and_model, halo_ranks, two_layers
from spawn_ranks import spawn_ranks

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def rank_results(tmp_path_factory):
    out = tmp_path_factory.mktemp("halo")
    spawn_ranks(halo_ranks, 2, str(tmp_path_factory.mktemp("cache")), str(out))
    return [torch.load(out / f"{rank}.pt") for rank in range(2)]


def test_rows_and_gradients_equal_the_whole_graph(rank_results):
    x, edge_index, grad_out, model = graph_and_model()
    x.requires_grad_()
    out = two_layers(model, x, edge_index, lambda t: t)
    out.backward(grad_out)
    torch.testing.assert_close(torch.cat([r["out"] for r in rank_results]), out.detach())
    torch.testing.assert_close(torch.cat([r["x"] for r in rank_results]), x.grad)
    for name, param in model.named_parameters():  # each rank holds its nodes' share of the weight gradient
        torch.testing.assert_close(sum(r["weights"][name] for r in rank_results), param.grad, msg=name)


def test_bytes_sent_are_the_rows_other_ranks_need(rank_results):
    for rank, result in enumerate(rank_results):
        other = rank_results[1 - rank]
        assert other["halo"] == result["send_rows"] > 0  # what one rank sends is the other's halo
        row_bytes = 8 * 4  # 8 float32 features; two layers, one exchange each way per layer
        assert result["sent"] == {"forward": 2 * result["send_rows"] * row_bytes,
                                  "backward": 2 * result["halo"] * row_bytes}
    assert OFFSETS[-1] == sum(r["out"].shape[0] for r in rank_results)
