"""The safe readers run no code from a file, and read back what tensors, containers and NumPy arrays hold."""

import collections
import io
import pickle
import struct
import warnings
import zipfile

import numpy as np
import pytest
import torch
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from kmipgt.safe_load import (
    NUMPY_ARRAY_GLOBALS,
    PLAIN_GLOBALS,
    RefusedFileError,
    UnsafeFileError,
    load_processed_dataset,
    load_restricted_pickle,
    tensor_globals,
    torch_load_safely,
)
from payloads import PAYLOADS, ShellPayload, TouchPayload


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_payloads_run_under_the_full_unpickler(tmp_path, payload):
    # Otherwise the refusal tests below (and in tests/train, tests/data) would prove nothing.
    marker = tmp_path / "marker"
    pickle.loads(pickle.dumps(payload(marker)))
    assert marker.exists()


@pytest.mark.parametrize(("payload", "refused"), [(ShellPayload, "posix.system"), (TouchPayload, "getattr")])
def test_torch_load_safely_refuses_code_with_one_line_naming_file_and_global(tmp_path, payload, refused):
    path, marker = tmp_path / "file.pt", tmp_path / "marker"
    torch.save({"weights": torch.ones(2), "extra": payload(marker)}, path)
    with pytest.raises(RefusedFileError) as error:
        torch_load_safely(path, path)
    assert str(error.value).splitlines() == [str(error.value)]
    assert str(error.value).startswith(f"{path} was not loaded: it refers to the global {refused},")
    assert error.value.refused == f"the global {refused}" and isinstance(error.value, ValueError)
    assert not marker.exists()


def test_torch_load_safely_reads_tensors_and_plain_values_and_the_globals_asked_for(tmp_path):
    path = tmp_path / "file.pt"
    content = {"w": torch.arange(3), "rows": [1, 2.5, "a", None, (3, 4)], "nested": {"b": True}}
    torch.save(content, path)
    loaded = torch_load_safely(path, path)
    assert torch.equal(loaded.pop("w"), content.pop("w")) and loaded == content
    torch.save(Data(x=torch.ones(2, 1)), path)
    with pytest.raises(RefusedFileError, match="DataEdgeAttr"):
        torch_load_safely(path, path)
    pyg = [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]
    assert torch.equal(torch_load_safely(io.BytesIO(path.read_bytes()), path, pyg).x, torch.ones(2, 1))
    assert Data in torch.serialization.get_safe_globals()  # PyG's own registration outlives the call


@pytest.mark.parametrize("payload", PAYLOADS)
def test_restricted_pickle_refuses_any_other_global(tmp_path, payload):
    path, marker = tmp_path / "file.pickle", tmp_path / "marker"
    path.write_bytes(pickle.dumps({"train": np.arange(3), "extra": payload(marker)}))
    allowed = {**PLAIN_GLOBALS, **NUMPY_ARRAY_GLOBALS, **tensor_globals(path)}
    with pytest.raises(RefusedFileError, match=f"^{path} was not loaded: it refers to the global "):
        load_restricted_pickle(path, allowed)
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_restricted_pickle_reads_containers_arrays_and_tensors(tmp_path, protocol):
    path = tmp_path / "file.pickle"
    content = {"split": np.array([2, 0], dtype=np.int64), "set": {1, 2}, "frozen": frozenset([3]),
               "scalar": np.int32(7), "graphs": [(torch.rand(3, 2), torch.tensor([[0, 1], [1, 0]]), [1, 0])]}
    path.write_bytes(pickle.dumps(content, protocol=protocol))
    loaded = load_restricted_pickle(path, {**PLAIN_GLOBALS, **NUMPY_ARRAY_GLOBALS, **tensor_globals(path)})
    np.testing.assert_array_equal(loaded["split"], content["split"])
    assert loaded["split"].dtype == np.int64 and loaded["scalar"] == 7
    assert loaded["set"] == {1, 2} and loaded["frozen"] == frozenset([3])
    for got, expected in zip(loaded["graphs"][0][:2], content["graphs"][0][:2], strict=True):
        assert torch.equal(got, expected)
    with pytest.raises(RefusedFileError, match=r"the global torch\._utils\._rebuild_tensor_v2"):
        load_restricted_pickle(path, {**PLAIN_GLOBALS, **NUMPY_ARRAY_GLOBALS})


class _HookedTensor:
    """Pickles as a tensor whose backward hook is ``int`` (a global the filter passes); torch itself never
    pickles hooks, so only a crafted file holds one."""

    def __reduce__(self):
        hooks = collections.OrderedDict([(0, int)])
        return torch._utils._rebuild_tensor_v2, (torch.ones(2).storage(), 0, (2,), (1,), False, hooks)


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated")
def test_restricted_pickle_refuses_a_tensor_with_backward_hooks(tmp_path):
    path = tmp_path / "file.pickle"
    path.write_bytes(pickle.dumps(_HookedTensor()))
    with pytest.raises(RefusedFileError, match="a tensor with backward hooks"):
        load_restricted_pickle(path, {**PLAIN_GLOBALS, **tensor_globals(path)})


def test_restricted_pickle_names_a_file_that_is_no_pickle(tmp_path):
    path = tmp_path / "file.pickle"
    path.write_bytes(pickle.dumps({"a": 1})[:-3])
    with pytest.raises(ValueError, match=f"{path} is not a readable pickle"):
        load_restricted_pickle(path, PLAIN_GLOBALS)


def test_processed_dataset_reads_pyg_files_and_refuses_code(tmp_path):
    path, marker = tmp_path / "data.pt", tmp_path / "marker"
    graphs = [Data(x=torch.rand(n, 2), edge_index=torch.tensor([[0, 1], [1, 0]])) for n in (3, 2)]
    InMemoryDataset.save(graphs, str(path))
    data, slices = load_processed_dataset(path)
    expected, expected_slices = InMemoryDataset.collate(graphs)
    assert torch.equal(data.x, expected.x) and torch.equal(slices["x"], expected_slices["x"])
    torch.save((expected.to_dict(), expected_slices, TouchPayload(marker)), path)
    with pytest.raises(RefusedFileError, match="refers to the global getattr"):
        load_processed_dataset(path)
    assert not marker.exists()
    torch.save((expected.to_dict(), expected_slices, dict), path)
    with pytest.raises(ValueError, match="data class is <class 'dict'>"):
        load_processed_dataset(path)


def test_a_plain_pickle_is_refused_by_the_weights_only_reader(tmp_path):
    path = tmp_path / "file.pt"
    path.write_bytes(pickle.dumps({"w": [1, 2]}))
    with pytest.raises(RefusedFileError, match=r"refers to content the weights-only unpickler does not read"):
        torch_load_safely(path, path)


class _Oversized:
    """Pickled as a tensor of ``size`` over ``storage``, whatever the storage holds."""

    def __init__(self, storage, size):
        self.storage, self.size = storage, size


class _OversizedPickler(pickle.Pickler):
    def reducer_override(self, obj):
        if isinstance(obj, _Oversized):
            arguments = (obj.storage, 0, obj.size, (1,), False, collections.OrderedDict())
            return torch._utils._rebuild_tensor_v2, arguments
        return NotImplemented


class _OversizedPickle:
    """A pickle module for ``torch.save(pickle_module=...)`` whose pickler writes :class:`_Oversized`."""

    __name__ = "oversized_pickle"
    Pickler = _OversizedPickler
    dump = staticmethod(pickle.dump)


def _ten_floats():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is what torch.save pickles for a tensor
        return torch.zeros(10).storage()


def _torch_never_reads(monkeypatch):
    """torch.load fails if called: a file must be refused before torch allocates anything for it."""

    def fail(*args, **kwargs):
        raise AssertionError("torch.load read the file")

    monkeypatch.setattr(torch, "load", fail)


@pytest.mark.parametrize("zipped", [True, False])
def test_a_tensor_beyond_its_storage_is_refused_before_torch_reads_it(tmp_path, zipped, monkeypatch):
    path = tmp_path / "file.pt"
    with open(path, "wb") as handle:
        torch.save(_Oversized(_ten_floats(), (50_000_000,)), handle, pickle_module=_OversizedPickle,
                   _use_new_zipfile_serialization=zipped)
    _torch_never_reads(monkeypatch)
    with pytest.raises(UnsafeFileError) as error:
        torch_load_safely(path, path)
    reason = "a tensor reaches element 50000000 of a storage of 10 elements"
    assert str(error.value) == f"{path} was not loaded: {reason}"


def test_a_pickled_tensor_beyond_its_storage_is_refused_before_it_is_built(tmp_path, monkeypatch):
    path = tmp_path / "file.pickle"
    with open(path, "wb") as handle:
        _OversizedPickler(handle).dump([_Oversized(_ten_floats(), (50_000_000,))])

    def fail(*args):
        raise AssertionError("the tensor was built")

    monkeypatch.setattr(torch._utils, "_rebuild_tensor_v2", fail)
    with pytest.raises(UnsafeFileError, match=r"reaches element 50000000 of a storage of 10 elements$"):
        load_restricted_pickle(path, {**PLAIN_GLOBALS, **tensor_globals(path)})


def _rezipped(path, compression):
    """``path``'s members written again with ``compression``."""
    with zipfile.ZipFile(path) as source:
        members = [(info, source.read(info.filename)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w", compression=compression) as target:
        for info, content in members:
            target.writestr(info.filename, content)


def test_a_compressed_member_is_refused_before_torch_reads_it(tmp_path, monkeypatch):
    # 20 MB of zeros compress to a file of 20 KB: the file's size would not bound what it unpacks to.
    path = tmp_path / "file.pt"
    torch.save(torch.zeros(20_000_000, dtype=torch.uint8), path)
    _rezipped(path, zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 100_000
    _torch_never_reads(monkeypatch)
    with pytest.raises(UnsafeFileError) as error:
        torch_load_safely(path, path)
    assert str(error.value).startswith(f"{path} was not loaded: its member file/data.pkl is compressed")


def _declaring(path, elements):
    """A ``torch.save`` file of ``torch.zeros(10)`` whose pickle declares ``elements`` for the storage."""
    torch.save(torch.zeros(10), path)
    with zipfile.ZipFile(path) as source:
        members = [(info, source.read(info.filename)) for info in source.infolist()]
    with zipfile.ZipFile(path, "w") as target:
        for info, content in members:
            if info.filename.endswith("data.pkl"):  # BININT1 10 after the location: the storage's size
                location = content.index(b"X\x03\x00\x00\x00cpu") + 8 + 2  # past "cpu" and its BINPUT
                assert content[location:location + 2] == b"K\n"
                content = content[:location] + b"J" + struct.pack("<i", elements) + content[location + 2:]
            target.writestr(info, content)


def test_storages_larger_than_the_file_are_refused_unless_allowed(tmp_path, monkeypatch):
    path = tmp_path / "file.pt"
    _declaring(path, 50_000_000)
    size = path.stat().st_size
    with pytest.raises(UnsafeFileError) as error:
        torch_load_safely(path, path)
    assert str(error.value).startswith(f"{path} was not loaded: its storages take 200000000 bytes, more than "
                                       f"the {size} it holds")
    # Allowed, the file reaches torch, which finds the storage's record too short.
    with pytest.raises(RuntimeError, match="record size"):
        torch_load_safely(path, path, max_bytes=200_000_000)
    torch.save(torch.zeros(10), path)
    assert torch.equal(torch_load_safely(path, path), torch.zeros(10))
    with pytest.raises(UnsafeFileError, match="its storages take 40 bytes, more than the 39 it holds"):
        torch_load_safely(path, path, max_bytes=39)
