"""Graph-level data kept on the device: a split collated once, mini-batches cut from it by graph index.

Collating a mini-batch of small graphs (LRGB: 200 molecules) on the host and copying it to the device is host
work in every step, which on a GPU can take as long as the step itself. With ``data.on_device: true`` each
split is collated once into one PyG ``Batch`` on the device and every mini-batch is gathered from it with
tensor ops, equal to what collating the same graphs would give.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Batch, Data

# The attribute under which a batch on a device keeps its CPU graph offsets, which the model reads on the
# host (kmipgt.train.batches.forward).
HOST_PTR = "host_ptr"

# data.on_device's default keeps a set of graphs on a CUDA device when its tensors take at most this share of
# the device's free memory (the rest is for the model, its activations and the optimiser).
RESIDENT_SHARE = 0.25

__all__ = ["HOST_PTR", "RESIDENT_SHARE", "ResidentGraphs", "graphs_nbytes", "resident_by_default"]


def graphs_nbytes(graphs: Sequence[Data]) -> int:
    """Bytes of every tensor attribute of ``graphs``."""
    return sum(value.nbytes for graph in graphs for _, value in graph if isinstance(value, Tensor))


def resident_by_default(nbytes: int, device: torch.device) -> bool:
    """``data.on_device``'s default: keep ``nbytes`` of graphs on ``device`` when it is a CUDA device with
    at least ``nbytes / RESIDENT_SHARE`` bytes free. Never on the CPU, where collating each batch costs
    milliseconds beside a step of seconds and a resident copy would double the data's memory."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return nbytes <= RESIDENT_SHARE * free


def _check_own_nodes(full: Batch) -> None:
    """ValueError unless each graph's ``edge_index`` of the collated ``full`` holds ids of its own nodes (then
    so does every batch cut from it, on the device without a check on the host)."""
    edge_index, ptr = full.edge_index.cpu(), full.ptr.cpu()
    counts = full._slice_dict["edge_index"].diff()
    graph = torch.repeat_interleave(torch.arange(counts.numel()), counts, output_size=edge_index.shape[1])
    first = ptr[graph]
    outside = ((edge_index < first) | (edge_index >= ptr[graph + 1])).any(0)
    if bool(outside.any()):
        bad = int(graph[outside][0])
        ids = edge_index[:, graph == bad] - ptr[bad]
        nodes = int(ptr[bad + 1] - ptr[bad])
        raise ValueError(
            f"graph {bad}'s edge_index must hold node ids in [0, {nodes}) for {nodes} nodes, got ids in "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )


@dataclass
class _Group:
    """Attributes that share one slicing: per graph, the rows ``slices[g]:slices[g + 1]`` (host ``[G+1]``)."""

    slices: Tensor
    keys: list[str]


class ResidentGraphs:
    """``graphs`` collated once into one ``Batch`` on ``device``; :meth:`batch` cuts mini-batches from it.

    Every attribute is a tensor concatenated along its PyG concatenation dimension (node, edge and graph
    attributes alike); an attribute that PyG increments when collating (``edge_index``) must be
    incremented by node counts, as node indices are. Anything else is a ValueError naming it.
    """

    def __init__(self, graphs: Sequence[Data], device: torch.device | str):
        if len(graphs) == 0:
            raise ValueError("graphs must hold at least one graph")
        self.device = torch.device(device)
        full = Batch.from_data_list(list(graphs))
        node_slices = full.ptr
        self._groups = [_Group(node_slices, [])]
        self._keys: list[str] = []  # in the order collating gives them
        self._cat_dims: dict[str, int] = {}
        self._node_indices: set[str] = set()
        for key, value in full:
            if key in ("batch", "ptr"):
                continue
            if not isinstance(value, Tensor):
                raise ValueError(f"graph attribute {key!r} is not a tensor ({type(value).__name__})")
            self._keys.append(key)
            self._cat_dims[key] = full.__cat_dim__(key, value) or 0
            self._group_of(full._slice_dict[key]).keys.append(key)
            increments = full._inc_dict[key]
            if increments is not None and bool((increments != 0).any()):
                if increments.reshape(len(graphs), -1).ne(node_slices[:-1, None]).any():
                    raise ValueError(
                        f"graph attribute {key!r} is incremented by something other than node counts"
                    )
                self._node_indices.add(key)
        self.num_graphs = len(graphs)
        self._base_class = type(graphs[0])
        if isinstance(getattr(full, "edge_index", None), Tensor):
            _check_own_nodes(full)
        self.full = full.to(self.device)

    def _group_of(self, slices: Tensor) -> _Group:
        for group in self._groups:
            if torch.equal(group.slices, slices):
                return group
        self._groups.append(_Group(slices, []))
        return self._groups[-1]

    def __len__(self) -> int:
        return self.num_graphs

    def batch(self, index: Tensor | Sequence[int]) -> Batch:
        """The mini-batch of graphs ``index`` (host ``[B]``, in that order) on the device, as
        ``Batch.from_data_list([graphs[i] for i in index])`` moved there would be.

        Sizes come from the host copy of the slicing, so nothing here waits for the device.
        """
        index = torch.as_tensor(index, dtype=torch.long, device="cpu")
        if index.dim() != 1 or index.numel() == 0:
            raise ValueError(f"index must be a non-empty 1-D tensor of graph ids, got {tuple(index.shape)}")
        if int(index.min()) < 0 or int(index.max()) >= self.num_graphs:
            raise ValueError(f"index must hold graph indices in [0, {self.num_graphs})")
        size = index.numel()
        starts = [group.slices[index] for group in self._groups]
        counts = [group.slices[index + 1] - first for group, first in zip(self._groups, starts, strict=True)]
        slices = [torch.cat([count.new_zeros(1), count.cumsum(0)]) for count in counts]
        node_shift = slices[0][:-1] - starts[0]  # new minus old node offset of each graph
        # One copy to the device: per group each graph's shift from new to old row and its row count,
        # then the batch's ptr and the node index shift.
        host = torch.cat([
            *(part for first, count, new in zip(starts, counts, slices, strict=True)
              for part in (first - new[:-1], count)),
            slices[0], node_shift,
        ])
        if self.device.type == "cuda":
            host = host.pin_memory()
        moved = host.to(self.device, non_blocking=True)
        moved = moved.split([size] * 2 * len(self._groups) + [size + 1, size])
        values, out_slices, out_increments = {}, {}, {}
        for number, group in enumerate(self._groups):
            row_shift, count = moved[2 * number], moved[2 * number + 1]
            total = int(slices[number][-1])
            rows = torch.repeat_interleave(row_shift, count, output_size=total)
            rows += torch.arange(total, device=self.device)
            for key in group.keys:
                values[key] = self.full[key].index_select(self._cat_dims[key], rows)
                out_slices[key], out_increments[key] = slices[number], torch.zeros(size, dtype=torch.long)
                if key in self._node_indices:
                    values[key] = values[key] + torch.repeat_interleave(moved[-1], count, output_size=total)
                    out_increments[key] = slices[0][:-1]
        out = Batch(_base_cls=self._base_class)
        for key in self._keys:
            out[key] = values[key]
        graph_ids = torch.arange(size, device=self.device)
        out.batch = torch.repeat_interleave(graph_ids, moved[1], output_size=int(slices[0][-1]))
        out.ptr = moved[-2]
        setattr(out, HOST_PTR, slices[0])
        out._slice_dict = {key: out_slices[key] for key in self._keys}
        out._inc_dict = {key: out_increments[key] for key in self._keys}
        out._num_graphs = size
        return out
