import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected

from kmipgt.data import positional_encodings
from kmipgt.data.positional_encodings import LaplacianPE, RandomWalkSE, random_walk_se_of_graphs


def _graph(num_nodes=40, seed=0, isolated=0):
    rng = np.random.default_rng(seed)
    parents = [int(rng.integers(0, i)) for i in range(1, num_nodes - isolated)]
    edges = torch.tensor([list(range(1, num_nodes - isolated)), parents])
    chords = torch.from_numpy(rng.integers(0, num_nodes - isolated, size=(2, num_nodes // 4)))
    edge_index = to_undirected(torch.cat([edges, chords], dim=1))
    edge_index = edge_index[:, edge_index[0] != edge_index[1]]
    return Data(edge_index=edge_index, num_nodes=num_nodes)


def _dense_adjacency(data):
    a = np.zeros((data.num_nodes, data.num_nodes))
    a[data.edge_index[0].numpy(), data.edge_index[1].numpy()] = 1.0
    return a


@pytest.mark.parametrize(("walk_length", "block_size"), [(1, 65536), (7, 65536), (16, 9)])
def test_rwse_matches_dense_matrix_powers(walk_length, block_size):
    data = _graph(isolated=2)
    out = RandomWalkSE(walk_length, block_size=block_size)(data.clone()).rwse
    a = _dense_adjacency(data)
    degree = a.sum(1)
    p = np.divide(a, degree[:, None], out=np.zeros_like(a), where=degree[:, None] > 0)
    expected = np.stack([np.diag(np.linalg.matrix_power(p, t)) for t in range(1, walk_length + 1)], axis=1)
    assert out.shape == (data.num_nodes, walk_length)
    np.testing.assert_allclose(out.numpy(), expected, atol=1e-6)


@pytest.mark.parametrize("block_size", [65536, 70, 1])
def test_rwse_of_many_graphs_is_each_graphs_own(block_size):
    """Graphs of 1 to 50 nodes (isolated nodes too), computed as unions of up to ``block_size`` nodes (one
    union, several, or one graph each), against dense matrix powers of each graph alone."""
    graphs = [_graph(num_nodes=n, seed=n, isolated=n % 3) for n in (30, 7, 50, 12, 4)]
    graphs.append(Data(edge_index=torch.empty(2, 0, dtype=torch.long), num_nodes=1))
    out = random_walk_se_of_graphs([g.edge_index for g in graphs], [g.num_nodes for g in graphs], 9,
                                   block_size=block_size)
    assert len(out) == len(graphs)
    for data, rwse in zip(graphs, out, strict=True):
        a = _dense_adjacency(data)
        degree = a.sum(1)
        p = np.divide(a, degree[:, None], out=np.zeros_like(a), where=degree[:, None] > 0)
        expected = np.stack([np.diag(np.linalg.matrix_power(p, t)) for t in range(1, 10)], axis=1)
        assert rwse.shape == (data.num_nodes, 9) and rwse.dtype == torch.float32
        np.testing.assert_allclose(rwse.numpy(), expected, atol=1e-6)
    assert random_walk_se_of_graphs([], [], 4) == []
    with pytest.raises(ValueError, match="2 edge_index tensors for 1 graphs"):
        random_walk_se_of_graphs([graphs[0].edge_index] * 2, [30], 4)


@pytest.mark.parametrize("sparse", [False, True])
def test_lappe_matches_dense_eigendecomposition(sparse, monkeypatch):
    if sparse:
        monkeypatch.setattr(positional_encodings, "_DENSE_LAPPE_MAX_NODES", 0)
    data = _graph(num_nodes=60, seed=3)
    out = LaplacianPE(k=5)(data.clone())
    a = _dense_adjacency(data)
    inv_sqrt = a.sum(1) ** -0.5
    laplacian = np.eye(60) - inv_sqrt[:, None] * a * inv_sqrt[None, :]
    values, vectors = np.linalg.eigh(laplacian)
    np.testing.assert_allclose(out.lappe_eigval[0].numpy(), values[1:6], atol=1e-5)
    for j in range(5):  # same eigenvector up to sign (the eigenvalues of this graph are simple)
        overlap = abs(float(out.lappe[:, j].double() @ torch.from_numpy(vectors[:, j + 1])))
        assert overlap == pytest.approx(1.0, abs=1e-5)
    peak = out.lappe.abs().argmax(0)
    assert (out.lappe[peak, torch.arange(5)] > 0).all()


def test_lappe_pads_small_graphs():
    data = Data(edge_index=torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]]), num_nodes=3)
    out = LaplacianPE(k=4)(data)
    assert out.lappe.shape == (3, 4) and torch.all(out.lappe[:, 2:] == 0)
    np.testing.assert_allclose(out.lappe_eigval[0, :2].numpy(), [1.0, 2.0], atol=1e-6)  # path P3 spectrum


def test_bad_arguments():
    with pytest.raises(ValueError, match="walk_length"):
        RandomWalkSE(0)
    with pytest.raises(ValueError, match="k must be"):
        LaplacianPE(0)
