"""Graphs saved with ``torch.save``, read without running code from the file and checked as read.

:func:`load_graph` reads one ``Data`` (S-SEG-WL inputs, a graph to predict on); :func:`load_saved_graphs`
reads what a user trains on: one ``Data``, a list of them, or ``{"train": [...], "val": [...], "test":
[...]}``, every graph checked for what training indexes or computes with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from kmipgt.data.graph_checks import check_edge_index, check_finite, check_node_rows, check_split_masks
from kmipgt.safe_load import UnsafeFileError, torch_load_safely

__all__ = ["check_saved_graph", "load_graph", "load_saved_graphs"]

SPLITS = ("train", "val", "test")
MASKS = tuple(f"{split}_mask" for split in SPLITS)


def _read_saved(path: str | Path) -> Any:
    """What ``torch.save`` wrote at ``path``, read weights-only with PyG's ``Data`` classes allowed."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no graph file at {path}")
    try:
        return torch_load_safely(path, path, safe_globals=[Data, DataEdgeAttr, DataTensorAttr, GlobalStorage])
    except UnsafeFileError:
        raise
    # A file that is no torch.save of a Data fails in the unpickler with whatever error the bytes trigger.
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a graph saved with torch.save(Data): {reason}") from None


def load_graph(path: str | Path) -> Data:
    """A PyG ``Data`` saved with ``torch.save`` (loaded with ``weights_only``: no pickled code runs), its
    ``edge_index`` checked: ``[2, E]`` integer ids of its own nodes (ValueError naming the file)."""
    graph = _read_saved(path)
    if not isinstance(graph, Data) or graph.get("edge_index") is None:
        raise ValueError(f"{path} does not hold a PyG Data with an edge_index (got {type(graph).__name__})")
    graph.edge_index = check_edge_index(graph.edge_index, graph.num_nodes, f"{path}: edge_index")
    return graph


def check_saved_graph(graph: Any, name: str) -> Data:
    """``graph`` when it is a ``Data`` that training can index: ``x [N, F]`` (finite where float),
    ``edge_index [2, E]`` of ids in ``[0, N)``, ``edge_attr [E, F_e]`` (finite where float) if present,
    boolean masks ``[N]`` or ``[N, S]`` that no node is in twice, and ``node_ids`` (N ids) if present.
    ``name`` starts every message (``graphs.pt: train[3]``)."""
    if not isinstance(graph, Data):
        raise ValueError(f"{name} is a {type(graph).__name__}, not a PyG Data")
    for key in ("x", "edge_index"):
        if graph.get(key) is None:
            raise ValueError(f"{name} has no {key}: a graph to train on needs node features x and edge_index")
    num_nodes = check_finite(check_node_rows(graph.x, f"{name}: x"), f"{name}: x").size(0)
    if graph.num_nodes != num_nodes:
        raise ValueError(f"{name}: x has {num_nodes} rows for {graph.num_nodes} nodes (one row per node)")
    graph.edge_index = check_edge_index(graph.edge_index, num_nodes, f"{name}: edge_index")
    edge_attr = graph.get("edge_attr")
    if edge_attr is not None:
        num_edges = graph.edge_index.size(1)
        if not isinstance(edge_attr, Tensor) or edge_attr.dim() != 2 or edge_attr.size(0) != num_edges:
            shape = list(edge_attr.shape) if isinstance(edge_attr, Tensor) else type(edge_attr).__name__
            raise ValueError(f"{name}: edge_attr must have shape [{num_edges}, F_e] (one row per edge_index "
                             f"column), got {shape}")
        check_finite(edge_attr, f"{name}: edge_attr")
    check_split_masks({key: graph.get(key) for key in MASKS}, num_nodes, name)
    node_ids = graph.get("node_ids")
    if node_ids is not None and (not isinstance(node_ids, list) or len(node_ids) != num_nodes):
        length = f" of {len(node_ids)}" if isinstance(node_ids, list) else ""
        raise ValueError(f"{name}: node_ids must be a list of {num_nodes} ids (one per node), got "
                         f"{type(node_ids).__name__}{length}")
    return graph


def _checked_list(graphs: Any, name: str) -> list[Data]:
    """``graphs`` when it is a non-empty list of graphs that pass :func:`check_saved_graph`."""
    if not isinstance(graphs, list):
        raise ValueError(f"{name} must be a list of PyG Data, got {type(graphs).__name__}")
    if not graphs:
        raise ValueError(f"{name} holds no graphs")
    return [check_saved_graph(graph, f"{name}[{index}]") for index, graph in enumerate(graphs)]


def load_saved_graphs(path: str | Path) -> Data | list[Data] | dict[str, list[Data]]:
    """The graph or graphs saved with ``torch.save`` at ``path`` (read weights-only), as saved: one ``Data``,
    a list of ``Data``, or ``{"train": [...], "val": [...], "test": [...]}``; each graph checked by
    :func:`check_saved_graph`, and anything else a ValueError naming the file."""
    saved = _read_saved(path)
    if isinstance(saved, Data):
        return check_saved_graph(saved, str(path))
    if isinstance(saved, list):
        return _checked_list(saved, str(path))
    if isinstance(saved, dict) and set(saved) == set(SPLITS):
        return {split: _checked_list(saved[split], f"{path}: {split}") for split in SPLITS}
    found = f"a dict with keys {sorted(map(str, saved))}" if isinstance(saved, dict) else \
        f"a {type(saved).__name__}"
    raise ValueError(f"{path} holds {found}; a graph file holds a Data, a list of Data or a dict of 'train', "
                     "'val' and 'test' lists of Data")
