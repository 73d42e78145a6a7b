"""A graph saved with ``torch.save``, read without running code from the file and checked as read."""

from __future__ import annotations

from pathlib import Path

from torch_geometric.data import Data
from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
from torch_geometric.data.storage import GlobalStorage

from kmipgt.data.graph_checks import check_edge_index
from kmipgt.safe_load import UnsafeFileError, torch_load_safely

__all__ = ["load_graph"]


def load_graph(path: str | Path) -> Data:
    """A PyG ``Data`` saved with ``torch.save`` (loaded with ``weights_only``: no pickled code runs), its
    ``edge_index`` checked: ``[2, E]`` integer ids of its own nodes (ValueError naming the file)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"no graph file at {path}")
    try:
        graph = torch_load_safely(
            path, path, safe_globals=[Data, DataEdgeAttr, DataTensorAttr, GlobalStorage]
        )
    except UnsafeFileError:
        raise
    # A file that is no torch.save of a Data fails in the unpickler with whatever error the bytes trigger.
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ValueError(f"{path} is not a graph saved with torch.save(Data): {reason}") from None
    if not isinstance(graph, Data) or graph.get("edge_index") is None:
        raise ValueError(f"{path} does not hold a PyG Data with an edge_index (got {type(graph).__name__})")
    graph.edge_index = check_edge_index(graph.edge_index, graph.num_nodes, f"{path}: edge_index")
    return graph
