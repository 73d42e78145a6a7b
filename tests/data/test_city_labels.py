import logging
import os

import networkx as nx
import numpy as np
import pytest
import torch

from kmipgt import cpus
from kmipgt.data import (
    city_labels,
    eccentricity_labels,
    partition_labels,
    random_split_masks,
    redraw_split_masks,
)


def _random_road_graph(num_nodes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A connected sparse graph with random positive lengths: a random tree plus extra chords."""
    rng = np.random.default_rng(seed)
    parents = np.array([rng.integers(0, i) for i in range(1, num_nodes)])
    tree = np.stack([np.arange(1, num_nodes), parents])
    chords = rng.integers(0, num_nodes, size=(2, num_nodes // 3))
    edges = np.concatenate([tree, chords], axis=1)
    edges = edges[:, edges[0] != edges[1]]
    edges = np.unique(np.sort(edges, axis=0), axis=1)  # one column per undirected edge
    return edges, rng.uniform(5.0, 500.0, size=edges.shape[1])


def _networkx_ball_eccentricity(edges: np.ndarray, lengths: np.ndarray, num_nodes: int, hops: int, node: int):
    graph = nx.Graph()
    graph.add_nodes_from(range(num_nodes))
    triples = zip(edges[0].tolist(), edges[1].tolist(), lengths.tolist(), strict=True)
    graph.add_weighted_edges_from(triples, weight="length")
    ball = nx.single_source_shortest_path_length(graph, node, cutoff=hops)
    return nx.eccentricity(graph.subgraph(ball), v=node, weight="length")


BACKENDS = ["scipy", pytest.param("numba", marks=pytest.mark.requires("numba"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hops", [0, 1, 3, 16])
def test_eccentricity_matches_networkx(hops, backend):
    edges, lengths = _random_road_graph(150, seed=hops)
    ecc, _ = eccentricity_labels(edges, lengths, 150, hops=hops, backend=backend, use_cache=False,
                                 progress=False)
    for node in range(0, 150, 7):
        expected = _networkx_ball_eccentricity(edges, lengths, 150, hops, node)
        assert abs(float(ecc[node]) - expected) < 1e-6


def test_eccentricity_direction_and_duplicates_do_not_matter():
    edges, lengths = _random_road_graph(120, seed=1)
    ecc_one_way, _ = eccentricity_labels(edges, lengths, 120, hops=4, use_cache=False, progress=False)
    both = np.concatenate([edges, edges[::-1]], axis=1)
    ecc_both, _ = eccentricity_labels(both, np.concatenate([lengths, lengths]), 120, hops=4,
                                      use_cache=False, progress=False)
    torch.testing.assert_close(ecc_one_way, ecc_both, rtol=0, atol=0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_worker_pool_matches_in_process(monkeypatch, backend):
    edges, lengths = _random_road_graph(600, seed=2)
    options = {"hops": 5, "use_cache": False, "progress": False}
    serial, _ = eccentricity_labels(edges, lengths, 600, num_workers=1, backend="scipy", **options)
    monkeypatch.setattr(city_labels, "_MIN_NODES_FOR_WORKERS", 0)
    monkeypatch.setattr(cpus, "available_cpus", lambda: 2)  # a pool of two even on one CPU
    pooled, _ = eccentricity_labels(edges, lengths, 600, num_workers=2, backend=backend, **options)
    torch.testing.assert_close(serial, pooled, rtol=0, atol=1e-9)


@pytest.mark.parametrize(("n", "num_classes"), [(1000, 10), (1003, 10), (37, 4), (5, 10)])
def test_partition_labels_equal_chunks_in_rank_order(n, num_classes):
    values = torch.from_numpy(np.random.default_rng(n).normal(size=n))
    labels = partition_labels(values, num_classes)
    chunk = n // num_classes + 1
    counts = torch.bincount(labels, minlength=num_classes)
    expected = [max(0, min(chunk, n - c * chunk)) for c in range(num_classes)]
    assert counts.tolist() == expected
    for c in range(num_classes - 1):
        if counts[c] and counts[c + 1]:
            assert values[labels == c].max() <= values[labels == c + 1].min()


def test_random_split_masks_sizes_disjoint_deterministic():
    train, val, test = random_split_masks(1005)
    assert (int(train.sum()), int(val.sum()), int(test.sum())) == (100, 100, 805)
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()
    assert (train | val | test).all()
    perm = np.random.RandomState(0).permutation(1005)
    assert set(np.flatnonzero(train.numpy())) == set(perm[:100].tolist())
    again = random_split_masks(1005)
    assert all(torch.equal(a, b) for a, b in zip((train, val, test), again, strict=True))


def test_redraw_split_masks_keeps_sizes_and_nodes_and_matches_random_split_masks():
    train, val, test = random_split_masks(1005)
    for seed in (1, 7):  # a split of every node, redrawn, is random_split_masks with that seed
        redrawn, fresh = redraw_split_masks(train, val, test, seed), random_split_masks(1005, seed=seed)
        assert all(torch.equal(a, b) for a, b in zip(redrawn, fresh, strict=True))
    # Nodes outside every mask stay outside; sizes stay; parts stay disjoint; another seed, another split.
    gen = torch.Generator().manual_seed(0)
    part = torch.randint(0, 4, (300,), generator=gen)  # 3: in no mask
    masks = (part == 0, part == 1, part == 2)
    one, other = redraw_split_masks(*masks, seed=1), redraw_split_masks(*masks, seed=2)
    assert [int(m.sum()) for m in one] == [int(m.sum()) for m in masks]
    assert torch.equal(one[0] | one[1] | one[2], part < 3)
    assert not (one[0] & one[1]).any() and not (one[0] & one[2]).any() and not (one[1] & one[2]).any()
    assert not torch.equal(one[0], other[0])
    with pytest.raises(ValueError, match="overlap"):
        redraw_split_masks(part < 2, part == 1, part == 2, seed=0)
    with pytest.raises(ValueError, match="boolean"):
        redraw_split_masks(part, part == 1, part == 2, seed=0)


def test_cache_hit_skips_computation(monkeypatch, tmp_path):
    edges, lengths = _random_road_graph(100, seed=3)
    first, y_first = eccentricity_labels(edges, lengths, 100, hops=3, progress=False)
    assert list((tmp_path / "kmipgt_cache" / "labels").glob("ecc-*.npy"))

    def fail(*args, **kwargs):
        raise AssertionError("cache miss: eccentricities were recomputed")

    monkeypatch.setattr(city_labels, "ball_eccentricity", fail)
    second, y_second = eccentricity_labels(edges, lengths, 100, hops=3, progress=False)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    assert torch.equal(y_first, y_second)
    with pytest.raises(AssertionError, match="cache miss"):  # other parameters are another key
        eccentricity_labels(edges, lengths, 100, hops=4, progress=False)


def test_bad_arguments_raise_clear_errors():
    edges, lengths = _random_road_graph(20, seed=4)
    with pytest.raises(ValueError, match="edge_index"):
        eccentricity_labels(edges[0], lengths, 20, use_cache=False)
    with pytest.raises(ValueError, match="edge_length"):
        eccentricity_labels(edges, lengths[:-1], 20, use_cache=False)
    with pytest.raises(ValueError, match="edge_length"):
        eccentricity_labels(edges, -lengths, 20, use_cache=False)
    with pytest.raises(ValueError, match=r"edge_index must hold node ids in \[0, 5\)"):
        eccentricity_labels(edges, lengths, 5, use_cache=False)
    with pytest.raises(ValueError, match="hops"):
        eccentricity_labels(edges, lengths, 20, hops=-1, use_cache=False)
    with pytest.raises(ValueError, match="num_classes"):
        eccentricity_labels(edges, lengths, 20, num_classes=0, use_cache=False)
    with pytest.raises(ValueError, match="backend"):
        eccentricity_labels(edges, lengths, 20, backend="gpu", use_cache=False)


def _tree(folder):
    return {str(path.relative_to(folder)): path.lstat() for path in sorted(folder.rglob("*"))}


def test_a_shared_cache_is_neither_read_nor_written(monkeypatch, tmp_path, caplog):
    edges, lengths = _random_road_graph(100, seed=3)
    expected, _ = eccentricity_labels(edges, lengths, 100, hops=3, progress=False)
    [cached] = (tmp_path / "kmipgt_cache" / "labels").glob("ecc-*.npy")
    # What someone who can write to a shared cache would plant: other labels under the entry's name, and
    # symlinks to a victim under the names of temporary files.
    shared, victim = tmp_path / "shared", tmp_path / "victim"
    (shared / "labels").mkdir(parents=True)
    np.save(shared / "labels" / cached.name, np.zeros(100))
    victim.write_text("someone else's file")
    for pid in range(os.getpid() - 5, os.getpid() + 50):
        (shared / "labels" / f"{cached.stem}.{pid}.tmp.npy").symlink_to(victim)
    os.chmod(shared, 0o777)
    before = _tree(shared)
    monkeypatch.setenv("KMIPGT_CACHE", str(shared))
    with caplog.at_level(logging.WARNING, logger="kmipgt"):
        eccentricity, _ = eccentricity_labels(edges, lengths, 100, hops=3, progress=False)
    torch.testing.assert_close(eccentricity, expected, rtol=0, atol=0)
    assert victim.read_text() == "someone else's file" and _tree(shared) == before
    [line] = [record.getMessage() for record in caplog.records]
    assert len(line.splitlines()) == 1 and line.startswith(f"{shared} belongs to another user or others may")


def test_workers_are_capped_at_the_cpus_this_process_may_use(monkeypatch, caplog):
    edges, lengths = _random_road_graph(600, seed=2)
    real_context, pools = city_labels.multiprocessing.get_context, []

    class Recording:
        def __init__(self, method):
            self.context = real_context(method)

        def Pool(self, processes, **options):
            pools.append(processes)
            return self.context.Pool(processes, **options)

    monkeypatch.setattr(city_labels.multiprocessing, "get_context", Recording)
    monkeypatch.setattr(city_labels, "_MIN_NODES_FOR_WORKERS", 0)
    with caplog.at_level(logging.WARNING, logger="kmipgt"):
        eccentricity_labels(edges, lengths, 600, hops=3, num_workers=150, use_cache=False, progress=False)
    allowed = len(os.sched_getaffinity(0))
    assert pools == ([allowed] if allowed > 1 else [])
    assert [record.getMessage() for record in caplog.records] == [
        f"num_workers: 150 is more than the {allowed} CPUs this process may use; using {allowed}"]
