"""S-SEG-WL on pairs with known answers, against networkx's WL hash, and its bound on a random GPS model."""

import re
from collections import Counter

import networkx as nx
import numpy as np
import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import from_networkx

from kmipgt.analysis.hops import undirected_adjacency
from kmipgt.analysis.seg_wl import random_walk_returns, seg_wl, shortest_paths
from kmipgt.cli import main
from kmipgt.data import load_graph
from kmipgt.data.positional_encodings import random_walk_se
from kmipgt.nn import GraphTransformer

RWSE_STEPS = 16


def _data(graph: nx.Graph) -> Data:
    """An unfeatured PyG graph (both edge directions) of a networkx graph, nodes relabelled 0..N-1."""
    graph = nx.convert_node_labels_to_integers(graph)
    data = from_networkx(graph)
    data.num_nodes = graph.number_of_nodes()
    return Data(edge_index=data.edge_index, num_nodes=graph.number_of_nodes())


def _decalin() -> nx.Graph:
    """Two six-rings sharing the bond 0-1."""
    return nx.Graph([(0, 1), *nx.utils.pairwise([0, 2, 3, 4, 5, 1]), *nx.utils.pairwise([0, 6, 7, 8, 9, 1])])


def _bicyclopentyl() -> nx.Graph:
    """Two five-rings joined by the bond 0-5."""
    graph = nx.disjoint_union(nx.cycle_graph(5), nx.cycle_graph(5))
    graph.add_edge(0, 5)
    return graph


def _csl(skip: int, n: int = 41) -> nx.Graph:
    """A circular skip link graph: the n-cycle plus chords i -> i + skip (4-regular)."""
    return nx.circulant_graph(n, [1, skip])


def _rook() -> nx.Graph:
    return nx.cartesian_product(nx.complete_graph(4), nx.complete_graph(4))


def _shrikhande() -> nx.Graph:
    """Cayley graph of Z4 × Z4 with generators ±(1,0), ±(0,1), ±(1,1): strongly regular (16, 6, 2, 2)."""
    steps = [(1, 0), (0, 1), (1, 1)]
    return nx.Graph(
        ((a, b), ((a + da) % 4, (b + db) % 4)) for a in range(4) for b in range(4) for da, db in steps
    )


def _two_triangles() -> nx.Graph:
    return nx.disjoint_union(nx.cycle_graph(3), nx.cycle_graph(3))


def _permuted(graph: nx.Graph, seed: int) -> nx.Graph:
    nodes = list(graph)
    order = np.random.default_rng(seed).permutation(len(nodes))
    return nx.relabel_nodes(graph, {v: nodes[i] for v, i in zip(nodes, order)})


# (pair, {encoding: distinguished}) with the answers known analytically:
# - 1-WL (and so "none") sees only degrees on regular / equal-degree-sequence pairs;
# - two triangles have unreachable pairs (SPD) and closed 3-walks (RWSE), the hexagon neither;
# - decalin is bipartite (no odd closed walks) with distances up to 5, bicyclopentyl has 5-rings;
# - the rook's graph and the Shrikhande graph are strongly regular with the same parameters: every node
#   sees 6 nodes at distance 1 and 9 at distance 2, and the same spectrum gives the same closed walks.
KNOWN_PAIRS = {
    "hexagon-two-triangles": (
        nx.cycle_graph(6),
        _two_triangles(),
        {"none": False, "spd": True, "rwse": True},
    ),
    "decalin-bicyclopentyl": (_decalin(), _bicyclopentyl(), {"none": False, "spd": True, "rwse": True}),
    "rook-shrikhande": (_rook(), _shrikhande(), {"none": False, "spd": False, "rwse": False}),
}


@pytest.mark.parametrize("name", sorted(KNOWN_PAIRS))
@pytest.mark.parametrize("encoding", ["none", "spd", "rwse"])
def test_known_pairs(name, encoding):
    first, second, expected = KNOWN_PAIRS[name]
    assert not nx.is_isomorphic(first, second)
    result = seg_wl([_data(first), _data(second)], encoding, rwse_steps=RWSE_STEPS)
    assert result.distinguished is expected[encoding]


def _csl_return_probabilities(skip: int, n: int = 41) -> np.ndarray:
    """Closed-walk probabilities of a circulant graph from its eigenvalues 2cos(2πj/n) + 2cos(2πjs/n)."""
    j = np.arange(n)
    eigenvalues = 2 * np.cos(2 * np.pi * j / n) + 2 * np.cos(2 * np.pi * j * skip / n)
    return np.array([np.mean(eigenvalues**t) / 4**t for t in range(1, RWSE_STEPS + 1)])


@pytest.mark.parametrize("skips", [(2, 3), (3, 9), (5, 16)])
def test_csl_pairs_against_distance_profiles_and_spectra(skips):
    graphs = [_csl(s) for s in skips]
    data = [_data(g) for g in graphs]
    assert not seg_wl(data, "none").distinguished  # both 4-regular
    # Vertex-transitive graphs: one colour class each, so the test compares one node's encodings.
    profiles = [Counter(nx.single_source_shortest_path_length(g, 0).values()) for g in graphs]
    assert seg_wl(data, "spd").distinguished is (profiles[0] != profiles[1])
    walks = [_csl_return_probabilities(s) for s in skips]
    differ = not np.allclose(walks[0], walks[1], rtol=0, atol=1e-12)
    assert seg_wl(data, "rwse", rwse_steps=RWSE_STEPS).distinguished is differ
    np.testing.assert_allclose(
        random_walk_returns(undirected_adjacency(data[0].edge_index, 41), RWSE_STEPS)[0], walks[0], atol=1e-12
    )


@pytest.mark.parametrize("encoding", ["none", "spd", "rwse"])
@pytest.mark.parametrize("seed", range(4))
def test_isomorphic_graphs_in_another_node_order_are_never_distinguished(encoding, seed):
    graph = nx.gnm_random_graph(14, 22, seed=seed)
    result = seg_wl([_data(graph), _data(_permuted(graph, seed))], encoding)
    assert not result.distinguished
    # The colouring is equivariant: the same multiset of colours lands on each graph.
    assert Counter(result.colours[0].tolist()) == Counter(result.colours[1].tolist())


def test_plain_refinement_agrees_with_networkx_wl_hash():
    pairs = [
        (nx.random_regular_graph(3, 12, seed=s), nx.random_regular_graph(3, 12, seed=s + 50))
        for s in range(5)
    ]
    pairs += [
        (nx.gnm_random_graph(12, 16, seed=s), nx.gnm_random_graph(12, 16, seed=s + 50)) for s in range(10)
    ]
    pairs += [(nx.cycle_graph(6), _two_triangles()), (_decalin(), _bicyclopentyl())]
    outcomes = set()
    for first, second in pairs:
        hashes = [nx.weisfeiler_lehman_graph_hash(g, iterations=g.number_of_nodes()) for g in (first, second)]
        distinguished = seg_wl([_data(first), _data(second)], "none").distinguished
        assert distinguished is (hashes[0] != hashes[1])
        outcomes.add(distinguished)
    assert outcomes == {True, False}  # both answers occur


def test_node_features_start_the_colours():
    graph = _data(nx.path_graph(4))
    marked = Data(x=torch.tensor([[1.0], [0.0], [0.0], [0.0]]), edge_index=graph.edge_index)
    unmarked = Data(x=torch.zeros(4, 1), edge_index=graph.edge_index)
    assert seg_wl([marked, unmarked], "none").distinguished
    assert not seg_wl([marked, unmarked], "none", features=False).distinguished


def test_shortest_paths_match_networkx():
    graph = _two_triangles()
    graph.add_edge(0, 1)
    hops = shortest_paths(undirected_adjacency(_data(graph).edge_index, 6))
    lengths = dict(nx.all_pairs_shortest_path_length(graph))
    for u in range(6):
        for v in range(6):
            assert hops[u, v] == lengths[u].get(v, -1)


def _gps_outputs(data: Data, seed: int, attention: str) -> torch.Tensor:
    """Graph-level output of a randomly initialised GPS model (GatedGCN + global attention, RWSE)."""
    torch.manual_seed(seed)
    model = GraphTransformer(
        1, 16, 4, num_layers=2, task="graph", attention=attention, encoder={"rwse_dim": RWSE_STEPS},
        attn_kwargs={**({"k": 4} if attention == "kmip" else {})},
    )
    model.eval()
    rwse = random_walk_se(data.edge_index, data.num_nodes, RWSE_STEPS)
    with torch.no_grad():
        return model(torch.ones(data.num_nodes, 1), data.edge_index, rwse=rwse)[0]


@pytest.mark.parametrize("attention", ["full", "kmip"])  # k-MIP with k = 4, fewer keys than nodes
@pytest.mark.parametrize("name", sorted(KNOWN_PAIRS))
def test_gps_with_rwse_separates_only_what_seg_wl_separates(name, attention):
    first, second, expected = KNOWN_PAIRS[name]
    pair = [_data(first), _data(second)]
    assert seg_wl(pair, "rwse", rwse_steps=RWSE_STEPS).distinguished is expected["rwse"]
    gaps = [
        (_gps_outputs(pair[0], s, attention) - _gps_outputs(pair[1], s, attention)).abs().max().item()
        for s in range(20)
    ]
    if expected["rwse"]:
        assert max(gaps) > 1e-3
    else:
        assert max(gaps) < 1e-5


def test_cli_prints_the_verdict_last(tmp_path, capsys):
    paths = [tmp_path / "hexagon.pt", tmp_path / "triangles.pt"]
    for path, graph in zip(paths, (nx.cycle_graph(6), _two_triangles())):
        torch.save(_data(graph), path)
    for encoding, verdict in (("spd", "distinguished"), ("none", "not distinguished")):
        assert main(["analysis", "wl", *map(str, paths), "--encoding", encoding]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == verdict
    assert load_graph(paths[0]).num_nodes == 6
    torch.save({"not": "a graph"}, tmp_path / "dict.pt")
    (tmp_path / "junk.pt").write_text("junk")
    for bad, named in (
        (tmp_path / "missing.pt", "missing.pt"),
        (tmp_path / "dict.pt", "dict.pt"),
        (tmp_path / "junk.pt", "junk.pt"),
    ):
        assert main(["analysis", "wl", str(paths[0]), str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("kmipgt: error: ") and named in err and err.count("\n") == 1, err


@pytest.mark.parametrize(("edge_index", "message"), [
    (torch.tensor([[0, 1], [1, 6]]), r"must hold node ids in \[0, 6\) for 6 nodes, got ids in \[0, 6\]"),
    (torch.tensor([[0, 1], [1, 2], [2, 0]]),
     r"must be an integer tensor of shape \[2, E\], got torch.int64 \[3, 2\]"),
])
def test_a_graph_file_is_checked_as_read(tmp_path, capsys, edge_index, message):
    path = tmp_path / "bad.pt"
    torch.save(Data(x=torch.ones(6, 1), edge_index=edge_index), path)
    assert main(["analysis", "wl", str(path), str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.match(rf"kmipgt: error: {path}: edge_index {message}$", err.strip())
