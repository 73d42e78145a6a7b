"""GraphTransformer: encoders, a stack of GPS layers and a node-, graph- or edge-level head."""

from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn import global_add_pool, global_mean_pool

from kmipgt.nn.attention_kinds import ATTENTION_KINDS, NO_ATTENTION
from kmipgt.nn.choices import POOLINGS, TASKS
from kmipgt.nn.encoders import EdgeEncoder, NodeEncoder, build_node_encoder
from kmipgt.nn.gps_layer import GPSLayer
from kmipgt.nn.grf_core import share_walk_caches
from kmipgt.nn.local_kinds import LOCAL_KINDS, NO_LOCAL
from kmipgt.nn.norms import build_norm, normalise
from kmipgt.ops.ragged import RaggedLayout, batch_layout


def _layer_arguments(channels: int, dropout: float, layer_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Every argument of the model's GPS layers, the layer's defaults filled in (TypeError naming an
    argument the layer does not take, or one the model sets itself)."""
    bound = inspect.signature(GPSLayer).bind(channels, dropout=dropout, **layer_kwargs)
    bound.apply_defaults()
    return dict(bound.arguments)


def _layers_with_attention(indices: list[int] | tuple[int, ...] | None, num_layers: int) -> set[int]:
    if indices is None:
        return set(range(num_layers))
    if any(not -num_layers <= i < num_layers for i in indices):
        raise ValueError(f"the attention's layers must index the {num_layers} layers, got {list(indices)}")
    return {i % num_layers for i in indices}


def check_task(task: str, pooling: str) -> None:
    """ValueError unless ``task`` is one of :data:`TASKS` and ``pooling`` one of :data:`POOLINGS`."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {TASKS}, got {task!r}")
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")


def _check_pairs_shape(name: str, pairs: Tensor) -> None:
    if not isinstance(pairs, Tensor) or pairs.dim() != 2 or pairs.shape[0] != 2:
        shape = tuple(pairs.shape) if isinstance(pairs, Tensor) else type(pairs).__name__
        raise ValueError(f"{name} must be a [2, E] tensor of node ids, got {shape}")
    if pairs.dtype.is_floating_point or pairs.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer node ids, got dtype {pairs.dtype}")


def check_node_pairs(name: str, pairs: Tensor, num_nodes: int) -> None:
    """ValueError unless ``pairs`` is a ``[2, E]`` integer tensor of node ids in ``[0, num_nodes)``, naming
    the ids found. It reads the ids: call it on host data, before the copy to a device (the training loop
    does, :func:`kmipgt.train.batches.batch_to_device`); a model checks with :func:`assert_node_pairs`."""
    _check_pairs_shape(name, pairs)
    if pairs.numel() == 0:
        return
    low, high = (int(v) for v in torch.aminmax(pairs))
    if low < 0 or high >= num_nodes:
        raise ValueError(
            f"{name} must hold node ids in [0, {num_nodes}) for {num_nodes} nodes, got ids in [{low}, {high}]"
        )


def assert_node_pairs(name: str, pairs: Tensor, num_nodes: int) -> None:
    """ValueError unless ``pairs`` is a ``[2, E]`` integer tensor of node ids in ``[0, num_nodes)``; on a
    device, or in a compiled or exported model, the range is a RuntimeError raised asynchronously.

    Indexing would wrap a negative id around to the last nodes silently, and an id ``>= N`` fails deep
    inside a scatter with a message that names neither the tensor nor the node count. The range check is
    an assertion (``torch._assert_async``) that the host never waits for on CUDA, and that a compiled or
    exported model keeps; there a failed one is reported at the next synchronisation, as a device-side
    assertion (the training loop checks each batch on the host first, :func:`check_node_pairs`).
    """
    _check_pairs_shape(name, pairs)
    in_range = ((pairs >= 0) & (pairs < num_nodes)).all()
    if torch.compiler.is_compiling():
        # The node count is symbolic there: formatting it would specialise the graph to one size.
        torch._assert_async(in_range, f"{name} must hold node ids in [0, N) for its N nodes")
        return
    try:
        torch._assert_async(in_range, f"{name} must hold node ids in [0, {num_nodes})")
    except RuntimeError:  # raised at once on the CPU: name the ids found
        check_node_pairs(name, pairs, num_nodes)
        raise


def readout(
    h: Tensor,
    task: str,
    pooling: str = "mean",
    batch: Tensor | None = None,
    edge_label_index: Tensor | None = None,
    layout: RaggedLayout | None = None,
) -> Tensor:
    r"""Node embeddings ``h [N, C]`` -> what the head sees for ``task`` (one of :data:`TASKS`).

    ``"node"``: ``h`` itself; ``"graph"``: mean or sum pooling per graph of ``batch``, ``[G, C]`` (``G``
    from ``layout``, the graphs of ``batch``, where given: PyG would read it from ``batch`` on the device);
    ``"edge"``: :math:`\mathbf{h}_u \odot \mathbf{h}_v` for each pair of ``edge_label_index``, ``[E', C]``.
    """
    if task == "graph":
        pool = global_mean_pool if pooling == "mean" else global_add_pool
        # The graph count from the batch's layout: PyG would read it off the device (batch.max() + 1).
        size = None if layout is None else layout.num_graphs
        return pool(h, batch, size=size)
    if task == "edge":
        if edge_label_index is None:
            raise ValueError("edge_label_index [2, E'] is required for task='edge'")
        assert_node_pairs("edge_label_index", edge_label_index, h.shape[0])
        return h[edge_label_index[0]] * h[edge_label_index[1]]
    return h


class MLPHead(torch.nn.Module):
    """``num_layers`` linear layers with activations between them (GraphGym's post-MP head)."""

    def __init__(self, channels: int, out_channels: int, num_layers: int = 2, dropout: float = 0.0):
        super().__init__()
        if num_layers <= 0:
            raise ValueError(f"head_layers must be positive, got {num_layers}")
        self.dropout = dropout
        self.lins = torch.nn.ModuleList(torch.nn.Linear(channels, channels) for _ in range(num_layers - 1))
        self.lin_out = torch.nn.Linear(channels, out_channels)

    def reset_parameters(self) -> None:
        for lin in [*self.lins, self.lin_out]:
            lin.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        for lin in self.lins:
            x = F.dropout(F.gelu(lin(x)), self.dropout, self.training)
        return self.lin_out(x)


class _ReadoutModel(torch.nn.Module):
    """What :class:`GraphTransformer` and the baselines share: the task, and ``forward`` as the subclass's
    ``embed`` -> :func:`readout` -> ``head``."""

    head: MLPHead

    def __init__(self, task: str, pooling: str):
        super().__init__()
        check_task(task, pooling)
        self.task, self.pooling = task, pooling

    def forward(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None, edge_attr: Tensor | None = None,
        lappe: Tensor | None = None, rwse: Tensor | None = None, edge_label_index: Tensor | None = None,
        ptr: Tensor | None = None, node_mask: Tensor | None = None, edge_mask: Tensor | None = None,
    ) -> Tensor:
        """Predictions: ``[N, out]`` (node), ``[G, out]`` (graph) or ``[E', out]`` (edge).

        ``ptr``: the ``[G + 1]`` graph offsets of ``batch`` (PyG's ``Batch.ptr``), best on the CPU, as the
        loader makes them: the attention and the pooling then read the batch's graphs without waiting for
        the device, and a compiled or exported model needs it for a ``batch`` of several graphs. Without it
        the graphs are read back from ``batch``.

        ``node_mask [N]`` / ``edge_mask [E]`` (bool, True: real): a batch packed to a fixed size
        (:mod:`kmipgt.train.padding`), its padding nodes in graphs of their own after the real ones; the
        BatchNorms then take their statistics over the real rows, so the real graphs' predictions (and
        the gradients through them) are those of the unpadded batch. The padding graphs' rows of the
        output are not to be read.
        """
        layout = batch_layout(
            x.shape[0], x.device, ptr=ptr, batch=batch, node_mask=node_mask, edge_mask=edge_mask
        )
        h = self.embed(x, edge_index, batch, edge_attr=edge_attr, lappe=lappe, rwse=rwse, layout=layout)
        return self.head(readout(h, self.task, self.pooling, batch, edge_label_index, layout))


class GraphTransformer(_ReadoutModel):
    r"""GraphGPS-style graph transformer with any global attention kind (k-MIP by default).

    ``NodeEncoder`` / ``EdgeEncoder`` -> ``num_layers`` × :class:`~kmipgt.nn.gps_layer.GPSLayer` -> head:

    - ``task="node"``: an MLP per node, ``[N, out_channels]``;
    - ``task="graph"``: mean or sum pooling per graph, then an MLP, ``[G, out_channels]``;
    - ``task="edge"``: an MLP on :math:`\mathbf{h}_u \odot \mathbf{h}_v` for each pair in
      ``edge_label_index``, ``[E', out_channels]``.

    The model is composed of its parts, each taking and checking its own options: the node encoder
    (``encoder``), the GPS layers (``**layer_kwargs``) and, inside them, the attention branch
    (``attn_kwargs``)::

        GraphTransformer(9, 64, 10, num_layers=4, task="graph", local="gatedgcn", attention="kmip",
                         attn_kwargs={"heads": 4, "k": 16}, encoder={"rwse_dim": 16})

    Args:
        in_channels: raw node feature size.
        channels: hidden size.
        out_channels: output size (classes, labels or targets).
        num_layers: number of GPS layers.
        task: one of :data:`TASKS`.
        edge_channels: raw edge feature size (0: featureless edges); read where the local MPNN takes edge
            features.
        edge_categories: the number of categories of each edge feature where they are category ids (the
            data's description, :class:`~kmipgt.data.registry.CategoricalFeatures`): they are embedded
            (:class:`~kmipgt.nn.encoders.CategoricalEncoder`) instead of mapped linearly.
        dropout: dropout in layers and head.
        pooling: graph-level pooling, ``"mean"`` or ``"sum"``.
        head_layers: layers of the output MLP.
        encoder: the node encoder, a :class:`~kmipgt.nn.encoders.NodeEncoder` or its keyword arguments
            (``coord_columns``, ``num_frequencies``, ``lappe_dim``, ``rwse_dim``, ``categories``,
            ``pe_channels``, ``rwse_norm``, ``attention_qk``). Its ``attention_qk`` says what the
            attention's queries and keys come from; with ``"encoding"`` or ``"position"`` the query and key
            projections start tied (:meth:`~kmipgt.nn.attention.ProjectedAttention.tie_query_key`), so each
            query's first top-k is its neighbourhood in the encoding.
        **layer_kwargs: the arguments of every :class:`~kmipgt.nn.gps_layer.GPSLayer` (``local``,
            ``attention``, ``norm``, ``norm_position``, ``checkpoint``, ``attn_kwargs``, ...; the layer's
            defaults where absent). ``attn_kwargs`` may hold one key the model reads itself, ``layers``:
            the indices of the layers that have global attention (default: all; negative indices count
            from the last layer). The others are built with ``attention="none"`` and without the
            attention's options, as is every layer with ``attention="none"``, so that a gated recipe's
            MPNN-only ablation is one override. With ``norm_position="pre"`` the last layer's output is
            normalised once. GRF layers share one set of walks
            (:func:`~kmipgt.nn.grf_core.share_walk_caches`) unless ``share_walks: false`` is among their
            ``attn_kwargs``.
    """

    def __init__(
        self,
        in_channels: int,
        channels: int,
        out_channels: int,
        num_layers: int = 4,
        task: str = "node",
        edge_channels: int = 0,
        edge_categories: tuple[int, ...] = (),
        dropout: float = 0.0,
        pooling: str = "mean",
        head_layers: int = 2,
        encoder: NodeEncoder | dict[str, Any] | None = None,
        **layer_kwargs: Any,
    ):
        super().__init__(task, pooling)
        if num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {num_layers}")
        self.node_encoder = build_node_encoder(encoder, in_channels, channels)
        attn_kwargs = dict(layer_kwargs.pop("attn_kwargs", None) or {})
        with_attention = _layers_with_attention(attn_kwargs.pop("layers", None), num_layers)
        qk_channels = self.node_encoder.qk_channels
        if "qk_channels" in attn_kwargs:
            raise ValueError("attn_kwargs 'qk_channels' is the encoder's: set its attention_qk instead")
        if qk_channels is not None:
            attn_kwargs["qk_channels"] = qk_channels
        layer = _layer_arguments(channels, dropout, {**layer_kwargs, "attn_kwargs": attn_kwargs})
        if layer["attention"] == NO_ATTENTION:
            with_attention = set()
        elif qk_channels is not None and not ATTENTION_KINDS.lookup(layer["attention"]).qk_x:
            raise ValueError(
                f"attention kind {layer['attention']!r} takes no qk_x: set the encoder's "
                "attention_qk='hidden'"
            )
        edges = layer["local"] != NO_LOCAL and LOCAL_KINDS.lookup(layer["local"]).supports_edge_attr
        self.edge_encoder = EdgeEncoder(edge_channels, channels, edge_categories) if edges else None
        without_attention = {**layer, "attention": NO_ATTENTION, "attn_kwargs": None}
        self.layers = torch.nn.ModuleList(
            GPSLayer(**(layer if i in with_attention else without_attention)) for i in range(num_layers)
        )
        # Pre-norm layers leave their residual stream unnormalised; the head gets it normalised once.
        pre_norm = any(gps.placement.stream for gps in self.layers)
        self.norm_out = build_norm(layer["norm"], channels) if pre_norm else None
        # Walks depend only on the graph: one set for all GRF layers, not one per layer (9 GB at London size).
        share_walk_caches(self)
        self._tie_position_attention()
        self.head = MLPHead(channels, out_channels, head_layers, dropout)

    def reset_parameters(self) -> None:
        for module in [self.node_encoder, self.edge_encoder, *self.layers, self.norm_out, self.head]:
            if module is not None:
                module.reset_parameters()
        self._tie_position_attention()

    def _tie_position_attention(self) -> None:
        if self.node_encoder.qk_channels is None:
            return
        for layer in self.layers:
            if hasattr(layer.attention, "tie_query_key"):
                layer.attention.tie_query_key()

    def embed(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None, edge_attr: Tensor | None = None,
        lappe: Tensor | None = None, rwse: Tensor | None = None, num_source_nodes: int | None = None,
        layout: RaggedLayout | None = None,
    ) -> Tensor:
        """Node embeddings ``[N, channels]`` after the last GPS layer.

        ``num_source_nodes``: the rows edge sources may index (default ``N``). More where the local MPNNs
        read their messages' sources from extended rows, as on a graph partition whose MPNN inputs are
        the own nodes followed by a halo from other ranks (:mod:`kmipgt.distributed.graph_model`).
        ``layout``: the graphs of ``batch`` (:func:`~kmipgt.ops.ragged.batch_layout`), built once and read by
        every layer.
        """
        assert_node_pairs("edge_index", edge_index, num_source_nodes or x.shape[0])
        node_mask = None if layout is None else layout.node_mask
        h = self.node_encoder(x, lappe=lappe, rwse=rwse, node_mask=node_mask)
        e = self.edge_encoder(edge_attr, edge_index.size(1)) if self.edge_encoder is not None else None
        qk = self.node_encoder.attention_inputs(x, lappe, rwse)
        for layer in self.layers:
            h, e = layer(h, edge_index, batch=batch, edge_attr=e, qk_x=qk, layout=layout)
        return h if self.norm_out is None else normalise(self.norm_out, h, batch, layout)
