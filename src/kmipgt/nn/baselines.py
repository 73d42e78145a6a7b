"""Baselines: PyG's MLP, GCN, GraphSAGE, GAT, SGFormer and Polynormer behind kmipgt's encoder and head."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn.models import GAT, GCN, MLP, GraphSAGE, Polynormer, SGFormer

from kmipgt.nn.choices import BASELINE_KINDS
from kmipgt.nn.encoders import NodeEncoder, build_node_encoder
from kmipgt.nn.model import MLPHead, _ReadoutModel, assert_node_pairs
from kmipgt.ops.ragged import RaggedLayout

_BASIC_GNNS = {"gcn": GCN, "sage": GraphSAGE, "gat": GAT}
# PyG's SGFormer and Polynormer pad a mini-batch of graphs into one dense tensor, and their attention
# normalisers count the padded keys (SGFormer also uses the padded size), so one graph's output depends on the
# other graphs of its batch: they are run on one graph at a time only.
_ONE_GRAPH_KINDS = {"sgformer": "SGFormer", "polynormer": "Polynormer"}
# Arguments of BaselineModel that a kind reads beyond the shared ones; SGFormer and Polynormer fix their own
# norms and ReLU, and only PyG's BasicGNN (message passing) models take a residual connection.
KIND_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "mlp": ("norm", "activation", "options"),
    **dict.fromkeys(_BASIC_GNNS, ("norm", "activation", "residual", "options")),
    "sgformer": ("options",),
    "polynormer": ("options",),
}
# kmipgt's norm kinds as PyG normalisations; PyG's LayerNorm normalises whole graphs unless mode="node",
# while GPS layers use a node-wise torch.nn.LayerNorm.
_PYG_NORMS = {"layer": ("layer_norm", {"mode": "node"}), "batch": ("batch_norm", {}),
              "graph": ("layer_norm", {"mode": "graph"})}


class ResidualConv(torch.nn.Module):
    """``x + conv(x, edge_index, ...)``: a residual connection around one convolution of a PyG BasicGNN.

    PyG's ``BasicGNN`` models have none; wrapping each of their convolutions keeps PyG's own loop (norm,
    activation, dropout after each layer), which then acts on ``x + conv(x)`` as in a post-norm GPS layer.

    Args:
        conv: a PyG convolution mapping ``channels`` to ``channels``.
    """

    def __init__(self, conv: torch.nn.Module):
        super().__init__()
        self.conv = conv

    def reset_parameters(self) -> None:
        self.conv.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor, **kwargs: Any) -> Tensor:
        return x + self.conv(x, edge_index, **kwargs)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.conv})"


def _pyg_norm(norm: str) -> tuple[str, dict[str, Any]]:
    if norm not in _PYG_NORMS:
        raise ValueError(f"norm must be one of {tuple(_PYG_NORMS)}, got {norm!r}")
    return _PYG_NORMS[norm]


def _build_body(
    kind: str,
    channels: int,
    num_layers: int,
    dropout: float,
    norm: str,
    activation: str,
    residual: bool,
    options: dict[str, Any],
) -> torch.nn.Module:
    """The PyG model of ``kind``, mapping ``channels`` to ``channels``; ``options`` override the mapping."""
    sizes = {"in_channels": channels, "hidden_channels": channels}
    if kind == "sgformer":
        mapped = {"gnn_num_layers": num_layers, "trans_dropout": dropout, "gnn_dropout": dropout}
        return SGFormer(**{**sizes, "out_channels": channels, **mapped, **options})
    if kind == "polynormer":
        rates = dict.fromkeys(("in_dropout", "dropout", "global_dropout"), dropout)
        mapped = {"local_layers": num_layers, **rates}
        body = Polynormer(**{**sizes, "out_channels": channels, **mapped, **options})
        # PyG 2.8.1 builds the global layers for hidden_channels inputs but feeds them heads·hidden_channels.
        given = body.pred_global.in_features
        if any(layer.h_lins.in_features != given for layer in body.global_attn):
            raise ValueError(
                f"PyG's Polynormer fails with heads > 1 (got {options['heads']}): its global layers expect "
                f"{body.global_attn[0].h_lins.in_features} input channels but get {given}"
            )
        # PyG's example trains the local layers alone first, then switches the global ones on; one shared
        # training loop has no phases, so they train from the first epoch (pred_local stays unused).
        body._global = True
        return body
    norm_name, norm_kwargs = _pyg_norm(norm)
    mapped = {"num_layers": num_layers, "dropout": dropout, "act": activation, "norm": norm_name,
              "norm_kwargs": norm_kwargs}
    if kind == "mlp":
        return MLP(**{**sizes, "out_channels": channels, **mapped, **options})
    body = _BASIC_GNNS[kind](**{**sizes, **mapped, **options})
    if residual:
        body.convs = torch.nn.ModuleList(ResidualConv(conv) for conv in body.convs)
    return body


class BaselineModel(_ReadoutModel):
    r"""A PyG baseline with the inputs and outputs of :class:`~kmipgt.nn.GraphTransformer`.

    :class:`~kmipgt.nn.encoders.NodeEncoder` (raw features, Fourier features of coordinates, LapPE, RWSE)
    -> PyG model (``channels`` -> ``channels``) -> readout (:func:`~kmipgt.nn.model.readout`: per node,
    pooled per graph, or :math:`\mathbf{h}_u \odot \mathbf{h}_v` per pair) -> :class:`~kmipgt.nn.MLPHead`.

    Kinds (:data:`BASELINE_KINDS`), all from ``torch_geometric.nn.models``:

    - ``"mlp"``: ``MLP`` of ``num_layers`` linear layers (no edges);
    - ``"gcn"``, ``"sage"``, ``"gat"``: ``GCN``, ``GraphSAGE``, ``GAT`` with ``num_layers`` convolutions;
    - ``"sgformer"``: ``SGFormer`` with ``num_layers`` GCN layers beside its linear global attention;
    - ``"polynormer"``: ``Polynormer`` with ``num_layers`` local layers, global layers on from the start.

    Like PyG's BasicGNN, the last layer is plain (no norm, activation or dropout after it). Edge features are
    not used. Every kind supports node- and edge-level tasks (one graph); SGFormer and Polynormer refuse
    graph-level tasks, because PyG pads a mini-batch of graphs and their attention normalisers count the
    padding, so a graph's output would depend on the other graphs of its batch. Their PyG ``forward`` ends in
    ``log_softmax`` (they are node classifiers); the embedding is read from their last linear layer with a
    forward hook, so PyG's ``forward`` runs unchanged.

    Args:
        kind: one of :data:`BASELINE_KINDS`.
        in_channels: raw node feature size.
        channels: hidden size.
        out_channels: output size (classes, labels or targets).
        num_layers: layers of the PyG model (>= 1).
        task: one of :data:`~kmipgt.nn.model.TASKS`.
        dropout: dropout in the PyG model (every dropout rate it has) and the head.
        norm: ``"layer"`` (node-wise) or ``"batch"``; MLP and BasicGNN kinds only.
        activation: activation name (PyG's ``activation_resolver``); MLP and BasicGNN kinds only.
        residual: ``x + conv(x)`` in every layer (:class:`ResidualConv`); ``gcn``, ``sage``, ``gat`` only.
        pooling: graph-level pooling, ``"mean"`` or ``"sum"``.
        head_layers: layers of the output MLP.
        encoder: the node encoder, a :class:`~kmipgt.nn.encoders.NodeEncoder` or its keyword arguments
            (``coord_columns``, ``num_frequencies``, ``lappe_dim``, ``rwse_dim``, ``categories``, ...), as
            :class:`~kmipgt.nn.GraphTransformer` takes it; its ``attention_qk`` must stay ``"hidden"``.
        options: more keyword arguments of the PyG model (e.g. ``{"heads": 4}`` for GAT, ``{"jk": "cat"}``,
            ``{"trans_num_layers": 1}`` for SGFormer, ``{"global_layers": 2}`` for Polynormer); they take
            precedence over what the arguments above map to.
    """

    def __init__(
        self, kind: str, in_channels: int, channels: int, out_channels: int, num_layers: int = 4,
        task: str = "node", dropout: float = 0.0, norm: str = "layer", activation: str = "gelu",
        residual: bool = False, pooling: str = "mean", head_layers: int = 2,
        encoder: NodeEncoder | dict[str, Any] | None = None, options: dict[str, Any] | None = None,
    ):
        if kind not in BASELINE_KINDS:
            raise ValueError(f"baseline kind must be one of {BASELINE_KINDS}, got {kind!r}")
        super().__init__(task, pooling)
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1 for the {kind!r} baseline, got {num_layers}")
        if task == "graph" and kind in _ONE_GRAPH_KINDS:
            raise ValueError(
                f"the {kind!r} baseline does not support task='graph': PyG's {_ONE_GRAPH_KINDS[kind]} pads "
                "the graphs of a mini-batch and its attention normaliser counts the padding, so each graph's "
                "output would depend on the other graphs in its batch"
            )
        if residual and kind not in _BASIC_GNNS:
            raise ValueError(f"residual is available for {tuple(_BASIC_GNNS)}, not for {kind!r}")
        self.kind = kind
        self.in_channels, self.channels, self.out_channels = in_channels, channels, out_channels
        self.num_layers = num_layers
        self.node_encoder = build_node_encoder(encoder, in_channels, channels)
        if self.node_encoder.qk_channels is not None:
            raise ValueError(f"the {kind!r} baseline has no attention: its encoder's attention_qk must be "
                             f"'hidden', got {self.node_encoder.attention_qk!r}")
        options = options or {}
        self.body = _build_body(kind, channels, num_layers, dropout, norm, activation, residual, options)
        self._embedding: Tensor | None = None
        if kind == "sgformer":
            self.body.fc.register_forward_hook(self._keep_embedding)
        elif kind == "polynormer":
            self.body.pred_global.register_forward_hook(self._keep_embedding)
        self.head = MLPHead(channels, out_channels, head_layers, dropout)

    def _keep_embedding(self, module: torch.nn.Module, inputs: tuple, output: Tensor) -> None:
        self._embedding = output

    def reset_parameters(self) -> None:
        for module in (self.node_encoder, self.body, self.head):
            module.reset_parameters()

    def embed(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None, lappe: Tensor | None = None,
        rwse: Tensor | None = None, *, edge_attr: Tensor | None = None, layout: RaggedLayout | None = None,
    ) -> Tensor:
        """Node embeddings ``[N, channels]`` after the PyG model.

        ``edge_attr`` and ``layout`` are accepted for the signature of :class:`~kmipgt.nn.GraphTransformer`
        and not used; a padded batch (``layout.node_mask``) is a ValueError: PyG's norms would pool its
        padding rows.
        """
        if layout is not None and layout.node_mask is not None:
            raise ValueError(f"the {self.kind!r} baseline takes no padded batch (node_mask): padding is for "
                             "GPS models (model.kind: gps)")
        assert_node_pairs("edge_index", edge_index, x.shape[0])
        h = self.node_encoder(x, lappe=lappe, rwse=rwse)
        if self.kind == "mlp":
            return self.body(h, batch=batch)
        if self.kind in _BASIC_GNNS:
            return self.body(h, edge_index, batch=batch)
        if batch is not None and batch.numel() and int(batch.max()) > 0:
            raise ValueError(f"the {self.kind!r} baseline takes one graph at a time, got a batch of several")
        self.body(h, edge_index, h.new_zeros(h.size(0), dtype=torch.long))
        h, self._embedding = self._embedding, None  # drop the reference so the graph can be freed
        return h

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.kind!r}, {self.in_channels}, {self.out_channels}, "
            f"channels={self.channels}, num_layers={self.num_layers}, task={self.task!r})"
        )
