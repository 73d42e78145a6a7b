"""Open Graph Benchmark datasets (``ogbn-*`` node-, ``ogbg-*`` graph-property) from a local root, and the
official Evaluator's metric.

``data: {name: ogb, options: {name: ogbn-arxiv, root: PATH}}`` reads OGB's release of the dataset, unpacked
as OGB's own download leaves it: ``<root>/ogbn_arxiv/`` (the name with ``_`` for ``-``; or
``<root>/ogbn_arxiv_pyg/`` where that exists) holding ``RELEASE_v1.txt``, ``raw/*.csv.gz`` and
``split/<split>/{train,valid,test}.csv.gz``. OGB's ``PygNodePropPredDataset`` /
``PygGraphPropPredDataset`` read it and write ``processed/`` beside it, through
:func:`~kmipgt.data.pyg_datasets.offline_class`: nothing is downloaded unless the option ``download: true``
is given, and OGB's question whether to delete a folder without its release marker is never asked (that
folder is refused). The official split (``get_idx_split()``) gives the node masks or the graph lists.

Link-property datasets (``ogbl-*``), the heterogeneous ``ogbn-mag`` and ``ogbg-code2`` (whose labels are
token sequences) are refused. Needs ``pip install 'kmipgt[ogb]'``.
"""

from __future__ import annotations

import contextlib
import difflib
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from kmipgt.data.lrgb import OGB_ATOM_DIMS, OGB_BOND_DIMS
from kmipgt.data.pyg_datasets import add_split_masks, offline_class, split_graphs
from kmipgt.data.registry import NUMERIC_FEATURES, CategoricalFeatures

KINDS = {"ogbn": "nodeproppred", "ogbg": "graphproppred"}
METRICS = ("acc", "rocauc", "ap", "rmse")  # the Evaluator's metrics of outputs and targets (not F1)
_ABSENT = object()


def _ogb(kind: str) -> ModuleType:
    """``ogb.nodeproppred`` or ``ogb.graphproppred``; the first import of ogb is made with ``outdated``
    hidden, since ogb then starts a thread that asks PyPI whether a newer ogb exists."""
    first = "ogb" not in sys.modules
    hidden = sys.modules.get("outdated", _ABSENT)
    if first:
        sys.modules["outdated"] = None  # ogb.version takes an ImportError of it for "do not check"
    try:
        import ogb.graphproppred
        import ogb.nodeproppred
    except ImportError:
        raise ImportError("OGB datasets need ogb: pip install 'kmipgt[ogb]'") from None
    finally:
        if first and hidden is _ABSENT:
            sys.modules.pop("outdated", None)
        elif first:
            sys.modules["outdated"] = hidden
    return getattr(ogb, kind)


def _master(kind: str) -> dict[str, dict[str, str]]:
    """OGB's table of the datasets of ``kind`` (its master.csv): name -> its entries, as strings."""
    import pandas as pd

    path = Path(_ogb(kind).__file__).parent / "master.csv"
    return pd.read_csv(path, index_col=0, keep_default_na=False).to_dict()


def _entry(name: Any) -> tuple[str, dict[str, str]]:
    """The kind (``nodeproppred`` or ``graphproppred``) and master.csv entry of ``name``; a name OGB does not
    list, or one this loader does not serve, is a ValueError."""
    masters = {kind: _master(kind) for kind in KINDS.values()}
    kind = KINDS.get(str(name).split("-")[0])
    if kind is None or name not in masters[kind]:
        if str(name).startswith("ogbl-"):
            raise ValueError(f"OGB's link-property datasets are not served, got {name!r}")
        names = [key for master in masters.values() for key in master]
        close = difflib.get_close_matches(str(name), names, n=3, cutoff=0.6)
        hint = f"close names: {', '.join(close)}" if close else f"OGB's names: {', '.join(names)}"
        raise ValueError(f"{name!r} is no node- or graph-property dataset of OGB; {hint}")
    meta = masters[kind][name]
    if meta.get("is hetero") == "True":
        raise ValueError(f"{name} is a heterogeneous graph; kmipgt trains on homogeneous graphs")
    if meta["eval metric"] not in METRICS:
        raise ValueError(f"{name}'s targets are {meta['task type']} (metric {meta['eval metric']}), which "
                         "kmipgt's tasks do not predict")
    return kind, meta


def _data_globals() -> list[type]:
    """PyG's classes of a pickled ``Data`` that PyG does not register with torch's weights-only loader
    (those it does are left out: leaving torch's context would unregister them)."""
    registered = torch.serialization.get_safe_globals()
    return [cls for cls in (DataEdgeAttr, DataTensorAttr, GlobalStorage) if cls not in registered]


def _release_folder(root: Path, name: str, meta: dict[str, str], download: bool) -> Path:
    """The folder OGB reads for ``name`` under ``root``, after the checks OGB would answer by asking or by
    downloading."""
    folder = root / name.replace("-", "_")
    if (root / f"{folder.name}_pyg").exists():  # where OGB's older releases put it; OGB reads it first
        folder = root / f"{folder.name}_pyg"
    marker = f"RELEASE_v{meta['version']}.txt"
    if folder.is_dir() and not (folder / marker).is_file():
        raise FileNotFoundError(f"{folder} has no {marker}, the marker of OGB's release of {name} (OGB would "
                                "offer to delete the folder); put the unpacked release there, or remove the "
                                "folder and set the data option download: true")
    if not folder.is_dir() and not download:
        raise FileNotFoundError(f"no copy of {name} in {folder}: put OGB's unpacked release there ({marker}, "
                                "raw/, split/), or set the data option download: true to let OGB download it")
    return folder


def ogb_dataset(name: str, root: str | Path, download: bool = False) -> Data | dict[str, list[Data]]:
    """An OGB node- or graph-property dataset from a local copy, with its official split.

    Args:
        name: OGB's name, ``ogbn-*`` or ``ogbg-*`` (``ogbn-arxiv``, ``ogbg-molhiv``, ...).
        root: the folder holding ``<name with _ for ->/`` (OGB's ``root``).
        download: let OGB download a missing copy.

    Returns:
        ``ogbn-*``: the graph as OGB gives it (``y [N, T]``) with boolean ``[N]`` ``train_mask``,
        ``val_mask``, ``test_mask`` from ``get_idx_split()``. ``ogbg-*``: ``{"train", "val", "test"}`` lists
        of graphs (``y [1, T]`` each), the official split's ``train``, ``valid`` and ``test``.
    """
    kind, meta = _entry(name)
    folder = _release_folder(Path(root), name, meta, download)
    module = _ogb(kind)
    base = module.PygNodePropPredDataset if kind == "nodeproppred" else module.PygGraphPropPredDataset
    hint = f" (OGB's release: {folder.name}/RELEASE_v{meta['version']}.txt, raw/, split/)"
    source = f"{name} in {folder}"
    # OGB reports its progress by print; it reads its processed file (a pickled Data) with torch's
    # weights-only loader, which needs PyG's storage classes allowed.
    with contextlib.redirect_stdout(sys.stderr), torch.serialization.safe_globals(_data_globals()):
        dataset = offline_class(base, download, hint)(name=name, root=str(root))
        split = dataset.get_idx_split()
    if kind == "nodeproppred":
        return add_split_masks(dataset[0], split, source)
    return split_graphs(dataset, split, source)


def ogb_categories(name: str, root: str | Path, download: bool = False) -> CategoricalFeatures:
    """Which features of OGB's ``name`` are category ids (arguments as :func:`ogb_dataset`): the molecules'
    (``ogbg-mol*``) atom and bond features; the other datasets' features are numbers."""
    if name.startswith("ogbg-mol"):
        return CategoricalFeatures(OGB_ATOM_DIMS, OGB_BOND_DIMS)
    return NUMERIC_FEATURES


def _evaluator_inputs(metric: str, num_tasks: int, outputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """``(y_true, y_pred)`` ``[N, T]`` as the Evaluator takes them, from model ``outputs`` and ``targets``."""
    outputs, targets = outputs.detach().cpu(), targets.detach().cpu()
    count = targets.size(0)
    if metric == "acc":  # class ids: targets [N] or [N, 1], outputs [N, C] logits
        y_true, y_pred = targets.reshape(count, -1), outputs.argmax(-1).reshape(count, -1)
    elif metric != "rmse" and num_tasks == 1 and outputs.dim() == 2 and outputs.size(1) == 2:
        # Two-class logits of one binary task: their difference orders the examples as the class-1
        # probability does, which is all ROC-AUC and AP read.
        y_true, y_pred = targets.reshape(count, -1), (outputs[:, 1] - outputs[:, 0]).unsqueeze(1)
    else:  # scores or values [N, T] ([N] for one task); NaN targets are unlabelled
        y_true, y_pred = targets.reshape(count, -1), outputs.reshape(outputs.size(0), -1)
    if y_pred.shape != y_true.shape or y_true.size(1) != num_tasks:
        raise ValueError(f"the Evaluator's {metric} takes {num_tasks} task(s) for each of N examples, got "
                         f"outputs {list(outputs.shape)} and targets {list(targets.shape)}")
    return y_true.double(), y_pred.double()


def ogb_evaluator(
    name: str, root: str | Path | None = None, download: bool = False
) -> tuple[str, Callable[[Tensor, Tensor], float]]:
    """:func:`ogb_evaluator_metric` of the dataset the ``ogb`` loader's options name (its registry
    entry's ``evaluator``; the other options do not change the metric)."""
    return ogb_evaluator_metric(name)


def ogb_evaluator_metric(name: str) -> tuple[str, Callable[[Tensor, Tensor], float]]:
    """The official metric of OGB's ``name``: its name (``"acc"``, ``"rocauc"``, ``"ap"``, ``"rmse"``) and a
    function of ``(outputs, targets)`` giving the Evaluator's value.

    ``acc``: ``outputs [N, C]`` logits (their argmax is the prediction), ``targets [N]`` or ``[N, 1]`` class
    ids. ``rocauc``, ``ap``: ``outputs [N, T]`` scores (``[N]`` for one task, or ``[N, 2]`` two-class logits
    of one task), ``targets [N, T]`` 0/1 with NaN where unlabelled. ``rmse``: ``outputs`` and ``targets``
    ``[N, T]`` values (``[N]`` for one task).
    """
    kind, _ = _entry(name)
    evaluator = _ogb(kind).Evaluator(name)
    metric, num_tasks = evaluator.eval_metric, evaluator.num_tasks

    def score(outputs: Tensor, targets: Tensor) -> float:
        outputs, targets = torch.as_tensor(outputs), torch.as_tensor(targets)
        y_true, y_pred = _evaluator_inputs(metric, num_tasks, outputs, targets)
        return float(evaluator.eval({"y_true": y_true, "y_pred": y_pred})[metric])

    return metric, score
