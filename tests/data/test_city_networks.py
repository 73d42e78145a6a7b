import re
import tarfile

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset

from kmipgt.cli import main
from kmipgt.data import CityNetworks, haversine_metres, load_city_network
from payloads import PAYLOADS

N = 60


def _write_copy(directory, *, index_masks=False, with_labels=True, with_masks=True):
    rng = np.random.default_rng(0)
    lonlat = np.stack([2.35 + rng.uniform(0, 0.02, N), 48.85 + rng.uniform(0, 0.02, N)], axis=1)
    x = torch.cat([torch.from_numpy(lonlat), torch.rand(N, 35, dtype=torch.float64)], dim=1)
    ring = torch.stack([torch.arange(N), (torch.arange(N) + 1) % N])  # one direction only
    edges = torch.cat([ring, torch.tensor([[0, 5], [1, 1]]).t(), ring[:, :3]], dim=1)  # chord, loop, repeats
    directory.mkdir(parents=True, exist_ok=True)
    torch.save(x, directory / "node_features_augmented.pt")
    torch.save(x[:, :12], directory / "node_features.pt")
    torch.save(edges, directory / "edge_indices.pt")
    if with_labels:
        torch.save(torch.arange(N) % 10, directory / "10-chunk_16-hop_node_labels.pt")
    if with_masks:
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(1))
        parts = {"train_mask": perm[:6], "valid_mask": perm[6:12], "test_mask": perm[12:]}
        for file, index in parts.items():
            mask = index if index_masks else torch.zeros(N, dtype=torch.bool).index_fill_(0, index, True)
            torch.save(mask, directory / f"{file}.pt")
    return x, edges


def _check_graph(data, x, expected_undirected):
    assert data.x.shape == x.shape and torch.allclose(data.x, x.float())
    pairs = set(map(tuple, data.edge_index.t().tolist()))
    assert pairs == expected_undirected | {(j, i) for i, j in expected_undirected}
    assert data.edge_index.size(1) == len(pairs)
    lonlat = x[:, :2].numpy()
    expected = haversine_metres(lonlat[data.edge_index[0]], lonlat[data.edge_index[1]])
    np.testing.assert_allclose(data.edge_length.numpy(), expected)


def _undirected(edges):
    return {(i, j) for i, j in edges.t().tolist() if i != j}


@pytest.mark.parametrize("index_masks", [False, True])
def test_extracted_directory_with_boolean_or_index_masks(tmp_path, index_masks):
    x, edges = _write_copy(tmp_path / "toy", index_masks=index_masks)
    data = load_city_network(tmp_path, "toy", labels="file")
    _check_graph(data, x, _undirected(edges))
    assert torch.equal(data.y, torch.arange(N) % 10)
    assert [int(data[k].sum()) for k in ("train_mask", "val_mask", "test_mask")] == [6, 6, N - 12]
    assert data.train_mask.dtype == torch.bool and not (data.train_mask & data.test_mask).any()
    assert "eccentricity" not in data


def test_tarball_and_dataset_wrapper(tmp_path):
    x, edges = _write_copy(tmp_path / "build" / "toy")
    with tarfile.open(tmp_path / "toy.tar.gz", "w:gz") as tar:
        tar.add(tmp_path / "build" / "toy", arcname="toy")
    from_archive = load_city_network(tmp_path, "toy")
    _check_graph(from_archive, x, _undirected(edges))
    dataset = CityNetworks(tmp_path / "toy.tar.gz", "toy", augmented=False)
    assert len(dataset) == 1 and dataset[0].x.shape == (N, 12)


def test_missing_labels_and_masks_are_computed(tmp_path):
    _write_copy(tmp_path / "toy", with_labels=False, with_masks=False)
    data = load_city_network(tmp_path, "toy", progress=False)
    assert data.eccentricity.shape == (N,) and torch.bincount(data.y).tolist() == [7] * 8 + [4]
    perm = np.random.RandomState(0).permutation(N)
    assert set(np.flatnonzero(data.train_mask.numpy())) == set(perm[:6].tolist())
    with pytest.raises(FileNotFoundError, match="labels='file'"):
        load_city_network(tmp_path, "toy", labels="file")


def test_pyg_processed_copy(tmp_path):
    x, edges = _write_copy(tmp_path / "scratch")
    x = x.float().double()  # the processed copy stores float32 coordinates
    data = Data(x=x.float(), edge_index=edges, y=torch.arange(N) % 10,
                train_mask=torch.ones(N, dtype=torch.bool), val_mask=torch.zeros(N, dtype=torch.bool),
                test_mask=torch.zeros(N, dtype=torch.bool))
    (tmp_path / "toy" / "processed").mkdir(parents=True)
    InMemoryDataset.save([data], str(tmp_path / "toy" / "processed" / "data.pt"))
    loaded = load_city_network(tmp_path, "toy")
    _check_graph(loaded, x, _undirected(edges))
    assert int(loaded.train_mask.sum()) == N


def test_missing_copy_lists_paths_and_wrong_size_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError) as error:
        load_city_network(tmp_path, "paris")
    message = str(error.value)
    for expected in ("node_features_augmented.pt", "edge_indices.pt", "paris.tar.gz", "processed/data.pt"):
        assert expected in message
    _write_copy(tmp_path / "paris")
    with pytest.raises(ValueError, match="114127 nodes"):
        load_city_network(tmp_path, "paris")
    with pytest.raises(ValueError, match="labels"):
        load_city_network(tmp_path, "paris", labels="maybe")


@pytest.mark.parametrize("payload", PAYLOADS)
def test_files_that_would_run_code_are_refused(tmp_path, payload):
    marker = tmp_path / "marker"
    (tmp_path / "toy" / "processed").mkdir(parents=True)
    processed = tmp_path / "toy" / "processed" / "data.pt"
    torch.save(({"x": torch.rand(N, 37), "edge_index": payload(marker)}, None, Data), processed)
    with pytest.raises(ValueError, match=f"^{processed} was not loaded: it refers to the global "):
        load_city_network(tmp_path, "toy")
    _write_copy(tmp_path / "raw")
    edges = tmp_path / "raw" / "edge_indices.pt"
    torch.save(payload(marker), edges)
    with pytest.raises(ValueError, match=f"^{edges} was not loaded"):
        load_city_network(tmp_path, "raw")
    assert not marker.exists()


@pytest.mark.parametrize(("file", "content", "message"), [
    ("edge_indices.pt", torch.tensor([[0, 1], [1, N]]),
     rf"must hold node ids in \[0, {N}\) for {N} nodes, got ids in \[0, {N}\]"),
    ("edge_indices.pt", torch.zeros(3, 4, dtype=torch.long),
     r"must be an integer tensor of shape \[2, E\], got torch.int64 \[3, 4\]"),
    ("edge_indices.pt", torch.tensor([[0.5, 1.0], [1.0, 2.0]]),
     r"must be an integer tensor .*torch.float32 \[2, 2\]"),
    ("10-chunk_16-hop_node_labels.pt", torch.full((N,), 10**12),
     r"must hold class ids in \[0, 65536\), got ids in \[1000000000000, 1000000000000\]"),
    ("10-chunk_16-hop_node_labels.pt", torch.arange(N) / 10,
     "must hold integer class ids, got torch.float32"),
    ("node_features_augmented.pt", torch.zeros(0, 37), "has no rows: the graph has no nodes"),
])
def test_graphs_are_checked_as_read_with_the_file_named(tmp_path, capsys, file, content, message):
    _write_copy(tmp_path / "toy")
    torch.save(content, tmp_path / "toy" / file)
    assert main(["data", "info", "city_networks", "--root", str(tmp_path), "--set", "name=toy"]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1
    assert re.match(rf"kmipgt: error: {tmp_path / 'toy' / file}:? {message}$", err.strip())
