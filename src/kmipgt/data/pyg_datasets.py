"""Any dataset class of ``torch_geometric.datasets``, named in a config and read from a local root.

``data: {name: pyg, options: {class: WebKB, root: PATH, name: Cornell}}`` builds ``WebKB(root=PATH,
name="Cornell")``. A config names the class only, never an import path: the class is looked up among PyG's
dataset classes, so a config shared with others runs no code of its own. The other options are the class's
constructor arguments, checked against its signature before it is called.

PyG reads its raw files from the class's ``raw_dir`` and writes its processed files under ``root`` as usual,
with three differences, made by a subclass of the named class (:func:`offline_class`):

- where PyG would download missing raw files, the loader stops with a one-line message naming the files and
  the folder PyG expects them in; the option ``download: true`` lets PyG's own download run instead;
- the records of ``pre_transform`` and ``pre_filter`` that PyG keeps beside its processed files are never
  read (PyG reads them with the full unpickler, so a planted one would run code);
- processed files loaded through ``InMemoryDataset.load`` are read weights-only by
  :func:`~kmipgt.safe_load.load_processed_dataset`, never retried with the full unpickler as PyG does.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.data import Dataset as PygDataset
from torch_geometric.data.dataset import files_exist, overrides_method
from torch_geometric.io import fs

from kmipgt.data.splits import index_to_mask
from kmipgt.safe_load import load_processed_dataset

SPLITS = ("train", "val", "test")
# The keys of an index split (``get_idx_split()``) for each part: OGB says "valid", PyG "val".
SPLIT_KEYS = {"train": ("train",), "val": ("val", "valid"), "test": ("test",)}
MISSING_SHOWN = 12  # missing raw files named in a message; the rest are counted


class _Offline:
    """Mixed in before a PyG dataset class: downloads only where allowed, never reads PyG's records of the
    transforms, and reads processed files weights-only."""

    allow_download = False
    copy_hint = ""  # what else the message on missing files says (e.g. the layout of a release)

    def _download_if_allowed(self) -> None:
        # Called where the class would download, by whatever test of its raw files it makes (SNAPDataset
        # makes its own), so nothing but the download itself is replaced.
        if self.allow_download:
            super().download()
            return
        try:
            missing = [Path(path).name for path in self.raw_paths if not fs.exists(path)]
        except NotImplementedError:  # a class that lists no raw files
            missing = ["the dataset's files"]
        shown = ", ".join(missing[:MISSING_SHOWN])
        more = f" and {len(missing) - MISSING_SHOWN} more" if len(missing) > MISSING_SHOWN else ""
        name = type(self).__name__
        raise FileNotFoundError(
            f"{name}: missing raw files in {self.raw_dir}: {shown}{more}{self.copy_hint}; put them there, or "
            f"set the data option download: true to let {name} download them")

    def _process(self) -> None:
        # PyG first compares processed/pre_transform.pt and pre_filter.pt, read with the full unpickler, with
        # the transforms given; here they are never read (nor written).
        if self.force_reload or not files_exist(self.processed_paths):
            fs.makedirs(self.processed_dir, exist_ok=True)
            self.process()

    def load(self, path: str, data_cls: type = Data) -> None:
        self.data, self.slices = load_processed_dataset(path, data_cls)


def offline_class(cls: type[PygDataset], download: bool = False, hint: str = "") -> type[PygDataset]:
    """``cls`` with :class:`_Offline` mixed in (same name): it downloads only where ``download`` is True, and
    ``hint`` is added to its message on missing raw files."""
    namespace = {"allow_download": download, "copy_hint": hint, "__module__": __name__,
                 "__qualname__": cls.__qualname__}
    if overrides_method(cls, "download"):  # PyG asks for raw files only of a class that can download them
        namespace["download"] = _Offline._download_if_allowed
    return type(cls.__name__, (_Offline, cls), namespace)


def dataset_classes() -> dict[str, type[PygDataset]]:
    """The dataset classes of ``torch_geometric.datasets`` by name: the only classes a config may name."""
    import torch_geometric.datasets as datasets

    found = {name: getattr(datasets, name, None) for name in datasets.__all__}
    return {name: cls for name, cls in found.items() if isinstance(cls, type) and issubclass(cls, PygDataset)}


def _dataset_class(name: Any) -> type[PygDataset]:
    """The class a config names; anything else is a ValueError naming close names."""
    classes = dataset_classes()
    if isinstance(name, str) and name in classes:
        return classes[name]
    if name is None:
        raise ValueError("dataset 'pyg' needs the option class: a dataset class of torch_geometric.datasets")
    close = difflib.get_close_matches(str(name), classes, n=3, cutoff=0.6)
    close += [key for key in classes if key.lower() == str(name).lower() and key not in close]
    path = " (a config names a class, never an import path)" if any(c in str(name) for c in ".:/") else ""
    hint = f"; close names: {', '.join(close)}" if close else "; see the list of torch_geometric.datasets"
    raise ValueError(f"class {name!r} is not a dataset class of torch_geometric.datasets{path}{hint}")


def _constructor_options(cls: type[PygDataset], root: str | Path | None, options: dict[str, Any]) -> dict:
    """``options`` (and ``root``, where given) as keyword arguments of ``cls``, checked against its
    signature before it is called."""
    signature = inspect.signature(cls)
    kwargs = dict(options)
    if root is not None:
        # Not left to the binding: a class that takes **kwargs (FakeDataset) would store root in its graphs.
        if "root" not in signature.parameters:
            raise ValueError(f"pyg class {cls.__name__} takes no root: it ships or generates its data")
        kwargs["root"] = str(root)
    known = [name for name, parameter in signature.parameters.items()
             if parameter.kind not in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD)]
    unknown = [name for name in kwargs if name not in known]
    takes_any = any(parameter.kind == parameter.VAR_KEYWORD for parameter in signature.parameters.values())
    if unknown and not takes_any:
        raise ValueError(f"pyg class {cls.__name__} takes no option {unknown[0]!r}; its options: "
                         f"{', '.join(known)}")
    try:
        signature.bind(**kwargs)
    except TypeError as error:
        raise ValueError(f"pyg class {cls.__name__}: {error}; its options: {', '.join(known)}") from None
    return kwargs


def _as_data(graph: Any, source: str) -> Data:
    if not isinstance(graph, Data):
        raise ValueError(f"{source} gives {type(graph).__name__} graphs; kmipgt trains on homogeneous graphs "
                         "(torch_geometric.data.Data)")
    return graph


def graph_list(dataset: PygDataset, source: str) -> list[Data]:
    """Every graph of ``dataset`` as a ``Data`` (its ``transform`` applied, as indexing applies it)."""
    return [_as_data(dataset[i], source) for i in range(len(dataset))]


def _split_parts(split: Mapping[str, Any], source: str) -> dict[str, Tensor]:
    """``{"train", "val", "test"}`` index (or mask) tensors of an index split keyed as PyG or OGB key it."""
    parts = {}
    for part, keys in SPLIT_KEYS.items():
        found = [split[key] for key in keys if key in split]
        if not found:
            raise ValueError(f"{source}: its split has the parts {sorted(split)}, not train, val (or valid), "
                             "test")
        parts[part] = torch.as_tensor(found[0])
    return parts


def add_split_masks(data: Data, split: Mapping[str, Any], source: str) -> Data:
    """``data`` with boolean ``[N]`` ``train_mask``, ``val_mask`` and ``test_mask`` from an index split
    (``get_idx_split()``: node ids, or boolean masks, per part)."""
    for part, index in _split_parts(split, source).items():
        data[f"{part}_mask"] = index_to_mask(index, data.num_nodes, f"{source}: {part} split")
    return data


def split_graphs(dataset: PygDataset, split: Mapping[str, Any], source: str) -> dict[str, list[Data]]:
    """The graphs of each part of an index split of ``dataset`` (graph ids, or boolean masks, per part)."""
    parts = _split_parts(split, source)
    for part, index in parts.items():
        if index.dtype == torch.bool or not index.numel():
            continue
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= len(dataset):  # a negative id would silently count from the end
            raise ValueError(f"{source}: its {part} split must hold graph ids in [0, {len(dataset)}), got "
                             f"ids in [{low}, {high}]")
    return {part: graph_list(dataset[index], source) for part, index in parts.items()}


def _index_split(dataset: PygDataset) -> Mapping[str, Any] | None:
    """The dataset's own index split (``get_idx_split()`` or ``split_idx``), or None."""
    get_split = getattr(dataset, "get_idx_split", None)
    return get_split() if callable(get_split) else getattr(dataset, "split_idx", None)


def pyg_dataset(
    root: str | Path | None = None, download: bool = False, **options: Any
) -> Data | list[Data] | dict[str, list[Data]]:
    """A dataset of ``torch_geometric.datasets`` as kmipgt's tasks take it.

    Args:
        root: the folder PyG reads and writes under (its ``root``); classes that ship or generate their data
            (KarateClub, FakeDataset) take none.
        download: let PyG download missing raw files (otherwise their absence is a FileNotFoundError naming
            them and their folder).
        options: ``class`` (the name of a class of ``torch_geometric.datasets``) and the class's constructor
            arguments (``name``, ``split``, ...).

    Returns:
        For a dataset of one graph, that ``Data`` (masks ``[N]``, or ``[N, S]`` where the class gives ``S``
        splits as columns; boolean ``[N]`` masks from the dataset's index split where it has one). For a
        dataset of many graphs, ``{"train", "val", "test"}`` lists of ``Data`` where the class has its own
        split (a ``split`` argument not given in ``options``: the class is built once per part; or an index
        split), else a plain list of ``Data``. Features and labels are as PyG gives them.
    """
    cls = _dataset_class(options.pop("class", None))
    kwargs = _constructor_options(cls, root, options)
    offline = offline_class(cls, download)
    dataset = offline(**kwargs)
    source = f"pyg class {cls.__name__}"
    if len(dataset) == 0:
        raise ValueError(f"{source} holds no graphs")
    split = _index_split(dataset)
    if len(dataset) == 1:
        data = _as_data(dataset[0], source)
        return data if split is None else add_split_masks(data, split, source)
    split_argument = inspect.signature(cls).parameters.get("split")
    if split_argument is not None and "split" not in options:
        # The dataset built above is the default split's: reused where that is a part.
        parts = {part: dataset if split_argument.default == part else offline(**kwargs, split=part)
                 for part in SPLITS}
        return {part: graph_list(graphs, source) for part, graphs in parts.items()}
    return graph_list(dataset, source) if split is None else split_graphs(dataset, split, source)
