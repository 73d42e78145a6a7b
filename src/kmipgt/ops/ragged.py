"""Ragged graph layouts: validate PyG ``ptr``/``batch`` and group small graphs into blocks.

A mini-batch of graphs is node-major and ragged, as in PyG: graph ``g`` owns nodes
``ptr[g]:ptr[g + 1]``. Attention never crosses graphs; kernels work on *blocks* of consecutive graphs
so that many small graphs cost one matmul instead of one Python iteration each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "GraphBlock",
    "RaggedLayout",
    "batch_layout",
    "graph_blocks",
    "graph_ptr",
    "host_to_device",
    "key_graph_ptr",
    "node_graph_bounds",
    "same_device",
]


def _check_index_tensor(name: str, value: Tensor) -> None:
    if not isinstance(value, Tensor):
        raise TypeError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() != 1:
        raise ValueError(f"`{name}` must be one-dimensional, got shape {tuple(value.shape)}")
    if value.dtype.is_floating_point or value.dtype.is_complex or value.dtype == torch.bool:
        raise TypeError(f"`{name}` must hold integers, got dtype {value.dtype}")


def _ptr_from_batch(batch: Tensor, num_nodes: int, num_graphs: int | None) -> Tensor:
    _check_index_tensor("batch", batch)
    if batch.numel() != num_nodes:
        raise ValueError(f"`batch` must have one entry per node ({num_nodes}), got {batch.numel()}")
    batch = batch.detach().cpu().long()
    if num_nodes == 0:
        return torch.zeros(1 if num_graphs is None else num_graphs + 1, dtype=torch.long)
    if int(batch.min()) < 0:
        raise ValueError("`batch` must hold non-negative graph ids")
    if bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("`batch` must be sorted (nodes of each graph contiguous, as in PyG's Batch.batch)")
    size = int(batch[-1]) + 1 if num_graphs is None else num_graphs
    counts = torch.bincount(batch, minlength=size)
    return torch.cat([counts.new_zeros(1), counts.cumsum(0)])


def graph_ptr(num_nodes: int, *, ptr: Tensor | None = None, batch: Tensor | None = None) -> Tensor:
    """Validated CSR offsets of the graphs in a node-major mini-batch.

    Args:
        num_nodes: N, the number of nodes (rows) in the batch.
        ptr: ``[G + 1]`` offsets, as ``Batch.ptr``: starts at 0, non-decreasing, ends at N.
        batch: ``[N]`` sorted graph id per node, as ``Batch.batch``.

    Returns:
        ``[G + 1]`` int64 offsets on the CPU. Neither argument means a single graph: ``[0, N]``.
        When both are given they must describe the same graphs.
    """
    if ptr is None and batch is None:
        return torch.tensor([0, num_nodes], dtype=torch.long)
    if ptr is None:
        return _ptr_from_batch(batch, num_nodes, None)
    _check_index_tensor("ptr", ptr)
    ptr = ptr.detach().cpu().long()
    if ptr.numel() == 0 or int(ptr[0]) != 0:
        raise ValueError("`ptr` must start at 0 (it holds CSR offsets of shape [num_graphs + 1])")
    if bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError("`ptr` must be non-decreasing")
    if int(ptr[-1]) != num_nodes:
        raise ValueError(f"`ptr` must end at the number of nodes ({num_nodes}), got {int(ptr[-1])}")
    if batch is not None and not torch.equal(_ptr_from_batch(batch, num_nodes, ptr.numel() - 1), ptr):
        raise ValueError("`ptr` and `batch` describe different graphs; pass one of them")
    return ptr


def key_graph_ptr(
    ptr: Tensor, num_keys: int, *, key_ptr: Tensor | None = None, key_batch: Tensor | None = None
) -> Tensor | None:
    """Validated ``[G + 1]`` CPU offsets of the keys' graphs, given the queries' validated ``ptr``.

    ``key_ptr``/``key_batch`` lay out the ``num_keys`` keys as ``ptr``/``batch`` do the queries (same G).
    Returns ``None`` where the keys are laid out as the queries (no key layout given, which needs as many
    keys as queries, or the same offsets), so callers keep the path where queries and keys share graphs.
    """
    num_queries = int(ptr[-1])
    if key_ptr is None and key_batch is None:
        if num_keys != num_queries:
            raise ValueError(
                f"`query` and `key` must have the same shape [N, H, d] unless `key_ptr` or `key_batch` lays "
                f"out the keys' graphs; got {num_queries} queries and {num_keys} keys"
            )
        return None
    try:
        key_ptr = graph_ptr(num_keys, ptr=key_ptr, batch=key_batch)
    except (TypeError, ValueError) as error:
        message = f"key layout (`key_ptr`/`key_batch`, as `ptr`/`batch` of the keys): {error}"
        raise type(error)(message) from None
    if key_ptr.numel() != ptr.numel():
        raise ValueError(
            f"the queries' and the keys' layouts must hold the same number of graphs, got {ptr.numel() - 1} "
            f"and {key_ptr.numel() - 1} (a `batch` ends at its largest graph id: pass `ptr`/`key_ptr` where "
            "the last graphs have no queries or no keys)"
        )
    return None if torch.equal(key_ptr, ptr) else key_ptr


@dataclass(frozen=True)
class GraphBlock:
    """Consecutive graphs processed together: query rows ``start:end`` and key rows ``key_start:key_end``.

    ``multi`` is true when more than one of its graphs holds rows (queries or keys), so scores between
    rows of different graphs must be masked out. Without a separate key layout the key rows are the
    query rows.
    """

    start: int
    end: int
    multi: bool
    key_start: int
    key_end: int


def graph_blocks(ptr: Tensor, min_nodes: int, key_ptr: Tensor | None = None) -> list[GraphBlock]:
    """Group consecutive graphs until each block holds at least ``min_nodes`` queries or keys.

    A block of several graphs costs ``(Σ n_g)²`` scores instead of ``Σ n_g²``; bounding the block size
    keeps that waste small while replacing thousands of tiny kernels by a few larger ones.
    ``key_ptr`` (``[G + 1]``, default ``ptr``) gives the graphs' key rows where they are not the queries'.
    """
    key_ptr = ptr if key_ptr is None else key_ptr
    blocks: list[GraphBlock] = []
    start = key_start = previous = previous_key = graphs_in_block = 0
    for end, key_end in zip(ptr[1:].tolist(), key_ptr[1:].tolist()):
        # A graph with rows on one side only still counts: its rows must be masked from the others'.
        if (end, key_end) == (previous, previous_key):
            continue
        previous, previous_key = end, key_end
        graphs_in_block += 1
        if max(end - start, key_end - key_start) >= min_nodes:
            blocks.append(GraphBlock(start, end, graphs_in_block > 1, key_start, key_end))
            start, key_start, graphs_in_block = end, key_end, 0
    if graphs_in_block:
        blocks.append(GraphBlock(start, int(ptr[-1]), graphs_in_block > 1, key_start, int(key_ptr[-1])))
    return blocks


def node_graph_bounds(
    ptr: Tensor, device: torch.device, key_ptr: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Per-query ``[M]`` start and end offsets of the keys of the query's own graph, on ``device``.

    ``ptr`` lays out the queries, ``key_ptr`` (default ``ptr``: the queries are the nodes) the keys.
    """
    key_ptr = ptr if key_ptr is None else key_ptr
    sizes = ptr[1:] - ptr[:-1]
    lo = torch.repeat_interleave(key_ptr[:-1], sizes)
    hi = torch.repeat_interleave(key_ptr[1:], sizes)
    return lo.to(device), hi.to(device)


def host_to_device(tensor: Tensor, device: torch.device) -> Tensor:
    """A CPU tensor on ``device``, copied from pinned memory without blocking the host (as it is on the
    CPU)."""
    if device.type == "cpu":
        return tensor
    if device.type == "cuda" and not torch.compiler.is_compiling():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)


class RaggedLayout:
    """The graphs of a node-major batch, as the host and the device each read them.

    Host facts (``ptr``, ``num_nodes``, ``max_nodes``) let kernels size their grids and pick a path
    without reading the device; device tensors (``device_ptr`` and what :meth:`derived` caches) are copied
    without blocking. A model builds the layout once per forward from the loader's CPU offsets and passes
    it to every layer, so the offsets are validated once and k-MIP (fused kernels, Triton search) and full
    attention on CUDA need no host sync for them.

    Building one reads no values (``num_nodes`` and ``max_nodes`` are read from ``ptr`` at their first use),
    so a compiled or exported model builds it from its ``ptr`` input like any other tensor op.

    Args:
        ptr: ``[G + 1]`` CPU int64 offsets (:meth:`from_ptr` validates them).
        device: where the batch lives (default: ``device_ptr``'s device, else the CPU).
        device_ptr: the same offsets on ``device`` where the caller has them (else copied at first use).
        node_mask, edge_mask: in a batch packed to a fixed size, ``[N]`` and ``[E]`` bool on the device, True
            for the real nodes and edges (the padding rows come after them, in graphs of their own); the
            norms that pool over rows (BatchNorm) read them. None: every row is real.
    """

    def __init__(
        self, ptr: Tensor, device: torch.device | str | None = None, *, device_ptr: Tensor | None = None,
        node_mask: Tensor | None = None, edge_mask: Tensor | None = None,
    ):
        if ptr.device.type != "cpu" or ptr.dtype != torch.long or ptr.dim() != 1 or ptr.shape[0] == 0:
            raise ValueError(
                "RaggedLayout takes [G + 1] int64 CPU offsets (RaggedLayout.from_ptr validates and moves any "
                f"ptr or batch), got {ptr.dtype} of shape {tuple(ptr.shape)} on {ptr.device}"
            )
        if device is None:
            device = "cpu" if device_ptr is None else device_ptr.device
        self.ptr = ptr
        self.device = torch.device(device)
        self.num_graphs = ptr.shape[0] - 1
        self.node_mask, self.edge_mask = node_mask, edge_mask
        self._derived: dict[str, object] = {}
        if device_ptr is not None:
            if device_ptr.shape != ptr.shape or not same_device(device_ptr.device, self.device):
                raise ValueError(
                    f"`device_ptr` must be the [{self.num_graphs + 1}] offsets on {self.device}, got shape "
                    f"{tuple(device_ptr.shape)} on {device_ptr.device}"
                )
            self._derived["device_ptr"] = device_ptr

    @classmethod
    def from_ptr(
        cls, num_nodes: int, device: torch.device | str = "cpu", *, ptr: Tensor | None = None,
        batch: Tensor | None = None,
    ) -> RaggedLayout:
        """The layout of ``num_nodes`` rows from ``ptr`` or ``batch`` (validated as :func:`graph_ptr`).

        Pass the loader's CPU ``ptr``: a CUDA ``ptr``/``batch`` is read back to the host once here.
        """
        return cls(graph_ptr(num_nodes, ptr=ptr, batch=batch), device)

    @property
    def num_nodes(self) -> int:
        """N, the rows of the batch (read from the host offsets)."""
        return self.derived("num_nodes", lambda layout: int(layout.ptr[-1]))

    @property
    def max_nodes(self) -> int:
        """The largest graph's size (0 without graphs), read from the host offsets."""
        return self.derived(
            "max_nodes", lambda layout: int(layout.ptr.diff().max()) if layout.num_graphs else 0
        )

    def to_device(self, tensor: Tensor) -> Tensor:
        """A CPU tensor on the layout's device (:func:`host_to_device`)."""
        return host_to_device(tensor, self.device)

    def derived(self, name: str, compute) -> object:
        """``compute(self)`` the first time ``name`` is asked, the cached value afterwards."""
        if name not in self._derived:
            self._derived[name] = compute(self)
        return self._derived[name]

    @property
    def device_ptr(self) -> Tensor:
        """``[G + 1]`` offsets on the device, copied at the first use only (a path that needs none copies
        nothing)."""
        return self.derived("device_ptr", lambda layout: layout.to_device(layout.ptr))

    def node_graph_position(self) -> tuple[Tensor, Tensor]:
        """``[N]`` graph of each node and its position in that graph, on the device."""

        def compute(layout: RaggedLayout) -> tuple[Tensor, Tensor]:
            sizes = layout.ptr.diff()
            graph = torch.repeat_interleave(torch.arange(layout.num_graphs), sizes)
            position = torch.arange(layout.num_nodes) - layout.ptr[graph]
            return layout.to_device(graph), layout.to_device(position)

        return self.derived("node_graph_position", compute)

    def __repr__(self) -> str:
        return (
            f"RaggedLayout(num_nodes={self.num_nodes}, num_graphs={self.num_graphs}, "
            f"max_nodes={self.max_nodes}, device={self.device})"
        )


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` name one device (``cuda`` and ``cuda:0`` do on a default device 0)."""
    a, b = torch.device(a), torch.device(b)
    if a.type != b.type:
        return False
    if a.index is None or b.index is None:
        current = torch.cuda.current_device() if a.type == "cuda" else None
        return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)
    return a.index == b.index


def batch_layout(
    num_nodes: int, device: torch.device, *, ptr: Tensor | None = None, batch: Tensor | None = None,
    node_mask: Tensor | None = None, edge_mask: Tensor | None = None,
) -> RaggedLayout | None:
    """The layout a model's forward passes to its layers: from ``ptr``, else ``batch``; None for one graph.

    ``ptr``: ``[G + 1]`` graph offsets, best the loader's CPU copy (``Batch.ptr`` before the batch moves):
    a device ``ptr`` is read back to the host once, and ``batch`` (sorted graph ids) once more. Offsets are
    validated unless the model is being compiled or exported, which passes ``ptr`` as it passes every
    shape (a sorted ``batch`` alone would have to be read back there).

    ``node_mask``/``edge_mask``: the real rows of a batch packed to a fixed size (:class:`RaggedLayout`);
    they need ``ptr``, whose graphs keep the padding nodes apart.
    """
    masks = {"node_mask": node_mask, "edge_mask": edge_mask}
    if ptr is None and (node_mask is not None or edge_mask is not None):
        raise ValueError("`node_mask`/`edge_mask` (a padded batch) need `ptr`, the graphs that keep the "
                         "padding nodes apart")
    if node_mask is not None and node_mask.shape != (num_nodes,):
        raise ValueError(
            f"`node_mask` must have one entry per node ({num_nodes}), got {tuple(node_mask.shape)}"
        )
    if ptr is None and batch is None:
        return None
    if torch.compiler.is_compiling():
        if ptr is None:
            raise ValueError(
                "a compiled or exported model needs `ptr`, the [G + 1] graph offsets (Batch.ptr), "
                "beside `batch`"
            )
        if ptr.device.type == "cpu":
            return RaggedLayout(ptr.long(), device, **masks)
        return RaggedLayout(ptr.long().cpu(), device, device_ptr=ptr.long(), **masks)
    # Given `ptr`, `batch` is not compared with it: that would read `batch` back from the device.
    host = graph_ptr(num_nodes, ptr=ptr) if ptr is not None else graph_ptr(num_nodes, batch=batch)
    on_device = ptr is not None and ptr.device.type != "cpu" and same_device(ptr.device, device)
    return RaggedLayout(host, device, device_ptr=ptr.long() if on_device else None, **masks)
