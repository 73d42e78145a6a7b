"""symmetric_edges and index_to_mask, built on PyG's utilities, keep their contracts."""

import pytest
import torch

from kmipgt.data import index_to_mask, symmetric_edges


def test_symmetric_edges_drop_self_loops_and_keep_the_shortest_parallel_edge():
    edge_index = torch.tensor([[0, 1, 2, 1, 3], [1, 0, 2, 2, 1]])
    length = torch.tensor([5.0, 3.0, 9.0, 2.0, 4.0], dtype=torch.float32)
    index, shortest = symmetric_edges(edge_index, 4, length)
    assert index.tolist() == [[0, 1, 1, 1, 2, 3], [1, 0, 2, 3, 1, 1]]
    assert shortest.dtype == torch.float64 and shortest.tolist() == [3.0, 3.0, 2.0, 4.0, 2.0, 4.0]
    unweighted, none = symmetric_edges(edge_index, 4)
    assert torch.equal(unweighted, index) and none is None


def test_index_to_mask_takes_indices_or_boolean_masks_and_names_bad_input():
    assert index_to_mask(torch.tensor([2, 0]), 4).tolist() == [True, False, True, False]
    boolean = torch.tensor([False, True, True])
    assert index_to_mask(boolean, 3) is boolean
    with pytest.raises(ValueError, match=r"train_mask: indices must lie in \[0, 3\)"):
        index_to_mask(torch.tensor([0, 3]), 3, name="train_mask")
    with pytest.raises(ValueError, match="shape"):
        index_to_mask(boolean, 4)
    with pytest.raises(ValueError, match="1-D integer"):
        index_to_mask(torch.tensor([0.0]), 3)
