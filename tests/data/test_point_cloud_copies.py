"""Loaders of local ShapeNet-Part and S3DIS copies against the files they read, streamed S3DIS splits, and
missing files' errors."""

import numpy as np
import pytest
import torch
from torch_geometric.data import Data

from kmipgt.data import knn_graph, load_dataset
from kmipgt.data.shapenet_part import shapenet_part, shapenet_part_category_parts
from kmipgt.data.streamed import StreamedGraphs
from point_cloud_copies import SHAPES, write_s3dis, write_shapenet_part


def test_shapenet_part_reads_the_official_splits(tmp_path):
    rows = write_shapenet_part(tmp_path)
    splits = shapenet_part(tmp_path, k=5)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [3, 1, 2]
    shapes = [shape for split in ("train", "val", "test") for s, _, shape, _ in SHAPES if s == split]
    categories = [c for split in ("train", "val", "test") for s, _, _, c in SHAPES if s == split]
    graphs = [g for s in ("train", "val", "test") for g in splits[s]]
    for graph, shape, category in zip(graphs, shapes, categories, strict=True):
        expected = torch.from_numpy(rows[shape])
        assert torch.equal(graph.pos, expected[:, :3]) and torch.equal(graph.x[:, :3], expected[:, 3:6])
        assert torch.equal(graph.x[:, 3:], expected[:, :3])
        assert torch.equal(graph.y, expected[:, 6].long()) and int(graph.category) == category
        assert set(graph.y.tolist()) <= set(shapenet_part_category_parts()[category])
        assert torch.equal(graph.edge_index, knn_graph(graph.pos, 5))
    mugs = shapenet_part(tmp_path, k=5, categories=["Mug"])
    assert [len(mugs[s]) for s in ("train", "val", "test")] == [1, 1, 1]


def test_shapenet_part_missing_files_name_the_layout(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not a directory.*synsetoffset2category\.txt"):
        shapenet_part(tmp_path / "nope")
    write_shapenet_part(tmp_path)
    (tmp_path / "03797390" / "m2.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"missing .*m2\.txt; expected the ShapeNet-Part 'normal'"):
        shapenet_part(tmp_path)
    (tmp_path / "train_test_split" / "shuffled_val_file_list.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"shuffled_val_file_list\.json"):
        shapenet_part(tmp_path)
    with pytest.raises(ValueError, match="categories must be among"):
        shapenet_part(tmp_path, categories=["Sofa"])


@pytest.mark.requires("h5py")
def test_s3dis_splits_blocks_by_area(tmp_path):
    data, label = write_s3dis(tmp_path)
    splits = load_dataset("s3dis", root=tmp_path, test_area=6, k=4, val_blocks=1)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [4, 1, 2]
    by_area = {6: [4, 5], 5: [3]}
    assert all(torch.equal(g.x, torch.from_numpy(data[i])) for g, i in zip(splits["test"], by_area[6],
                                                                            strict=True))
    blocks = {tuple(g.x[0].tolist()): g for s in splits.values() for g in s}
    assert len(blocks) == 7
    for index in range(7):
        graph = blocks[tuple(data[index, 0].tolist())]
        assert torch.equal(graph.y, torch.from_numpy(label[index].astype(np.int64)))
        assert torch.equal(graph.pos, torch.from_numpy(data[index, :, :3]))
        assert torch.equal(graph.edge_index, knn_graph(graph.pos, 4))
    area5 = load_dataset("s3dis", root=tmp_path / "indoor3d_sem_seg_hdf5_data", test_area=5, k=4)
    assert [len(area5[s]) for s in ("train", "val", "test")] == [5, 1, 1]
    assert torch.equal(area5["test"][0].x, torch.from_numpy(data[3])) and int(area5["test"][0].area) == 5


@pytest.mark.requires("h5py")
def test_s3dis_missing_files_and_options(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"not a directory.*ply_data_all"):
        load_dataset("s3dis", root=tmp_path / "nope")
    write_s3dis(tmp_path)
    (tmp_path / "indoor3d_sem_seg_hdf5_data" / "room_filelist.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"room_filelist\.txt"):
        load_dataset("s3dis", root=tmp_path)
    with pytest.raises(ValueError, match="test_area"):
        load_dataset("s3dis", root=tmp_path, test_area=7)


def test_s3dis_without_h5py_is_a_clear_message(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_h5py(name, *args, **kwargs):
        if name == "h5py":
            raise ImportError("No module named 'h5py'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_h5py)
    with pytest.raises(ImportError, match=r"pip install 'kmipgt\[s3dis\]'"):
        load_dataset("s3dis", root=tmp_path)


def _same_graph(a, b) -> bool:
    return set(a.keys()) == set(b.keys()) and all(torch.equal(a[key], b[key]) for key in sorted(a.keys()))


@pytest.mark.requires("h5py")
def test_s3dis_streams_the_blocks_it_would_hold(tmp_path):
    data, label = write_s3dis(tmp_path)
    held = load_dataset("s3dis", root=tmp_path, k=4, val_blocks=1)
    streamed = load_dataset("s3dis", root=tmp_path, k=4, val_blocks=1, stream=True)
    for split in ("train", "val", "test"):
        assert isinstance(streamed[split], StreamedGraphs) and len(streamed[split]) == len(held[split])
        assert all(_same_graph(a, b) for a, b in zip(held[split], streamed[split], strict=True))
    train = streamed["train"]
    # A mini-batch in any order, with repeats, is read in one call and comes back in that order.
    batch = train.__getitems__([3, 0, 3, -1])
    assert all(_same_graph(a, held["train"][i]) for a, i in zip(batch, [3, 0, 3, -1], strict=True))
    assert all(_same_graph(a, b) for a, b in zip(train[1:3], held["train"][1:3], strict=True))
    assert all(_same_graph(a, held["train"][i]) for a, i in zip(train.subset([2, 0]), [2, 0], strict=True))
    # The first test block against the file itself: area 6's blocks are rows 4 and 5.
    first = streamed["test"][0]
    assert torch.equal(first.x, torch.from_numpy(data[4])) and torch.equal(first.y, torch.from_numpy(
        label[4].astype(np.int64))) and torch.equal(first.edge_index, knn_graph(first.pos, 4))
    with pytest.raises(IndexError, match="does not exist"):
        train[len(train)]


@pytest.mark.requires("h5py")
def test_s3dis_block_count_must_match_the_room_list(tmp_path):
    write_s3dis(tmp_path)
    rooms = tmp_path / "indoor3d_sem_seg_hdf5_data" / "room_filelist.txt"
    rooms.write_text("".join(rooms.read_text().splitlines(keepends=True)[:-1]))
    with pytest.raises(ValueError, match=r"names 6 blocks, the \.h5 files hold 7"):
        load_dataset("s3dis", root=tmp_path, stream=True)


def test_streamed_graphs_read_a_batch_or_a_chunk_at_a_time():
    calls = []

    def read(ids):
        calls.append(list(ids))
        return [Data(x=torch.tensor([[float(i)]])) for i in ids]

    graphs = StreamedGraphs(read, [5, 3, 9, 1, 7], chunk_size=2).map(lambda g: Data(x=g.x * 10))
    assert [float(g.x) for g in graphs] == [50, 30, 90, 10, 70] and calls == [[5, 3], [9, 1], [7]]
    calls.clear()
    assert [float(g.x) for g in graphs.__getitems__([4, 0, 4])] == [70, 50, 70] and calls == [[7, 5, 7]]
    assert [float(g.x) for g in graphs[1:3]] == [30, 90] and [float(g.x) for g in graphs.subset([3])] == [10]
    with pytest.raises(TypeError, match="ints"):
        graphs[1.0]
    with pytest.raises(ValueError, match="chunk_size"):
        StreamedGraphs(read, [1], chunk_size=0)
