"""Categorical features embedded, one table per column, summed: against one-hot rows times the tables."""

import pytest
import torch
import torch.nn.functional as F

from kmipgt.nn import EdgeEncoder, NodeEncoder
from kmipgt.nn.encoders import CategoricalEncoder


def test_each_column_picks_a_row_of_its_own_table_and_the_rows_are_summed():
    torch.manual_seed(0)
    sizes = (7, 3, 2)
    encoder = CategoricalEncoder(sizes, 5)
    x = torch.stack([torch.randint(0, size, (11,)) for size in sizes], 1).to(torch.uint8)
    expected = sum(F.one_hot(x[:, c].long(), size).float() @ encoder.embeddings[c].weight
                   for c, size in enumerate(sizes))
    torch.testing.assert_close(encoder(x), expected)
    assert repr(encoder) == "CategoricalEncoder([7, 3, 2], 5)"


def test_ids_a_linear_map_would_order_are_independent_rows():
    # Carbon, nitrogen and oxygen (ids 6, 7, 8): a linear map puts them on one line, the embedding does not.
    torch.manual_seed(0)
    encoder = CategoricalEncoder((119,), 16)
    carbon, nitrogen, oxygen = encoder(torch.tensor([[6], [7], [8]]))
    assert not torch.allclose(nitrogen - carbon, oxygen - nitrogen)


def test_node_and_edge_encoders_embed_category_ids_where_the_data_says_so():
    node = NodeEncoder(2, 8, categories=(4, 3))
    edge = EdgeEncoder(1, 8, categories=(5,))
    assert node.lin_x is None and node.embed_x.sizes == (4, 3)
    assert edge.lin is None and edge.embed.sizes == (5,)
    assert node(torch.tensor([[3, 2], [0, 0]])).shape == (2, 8)
    assert edge(torch.tensor([[4], [1], [0]]), 3).shape == (3, 8)
    with pytest.raises(ValueError, match="one size per column of x"):
        NodeEncoder(3, 8, categories=(4, 3))
    with pytest.raises(ValueError, match="integer category ids of shape"):
        node(torch.rand(2, 2))
    with pytest.raises(ValueError, match="positive category counts"):
        CategoricalEncoder((4, 0), 8)
