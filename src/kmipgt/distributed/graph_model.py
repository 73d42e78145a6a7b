"""A GraphTransformer trained on one rank's share of a graph whose nodes are partitioned across ranks.

Each GPS layer then works on this rank's own nodes only: before its MPNN the halo rows are exchanged
(:func:`~kmipgt.distributed.halo_exchange`) and the MPNN reads its messages' sources from
``[own nodes; halo]`` (PyG's bipartite ``(x_src, x_dst)`` input, updating the own nodes alone); its k-MIP
core attends over every rank's nodes (:func:`~kmipgt.distributed.sharded_kmip_attention`, exact); its
BatchNorms take the statistics of all ranks' rows (:class:`~kmipgt.distributed.GlobalBatchNorm`). So the
own nodes' outputs, and the parameter gradients summed over ranks, are those of one process on the graph.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from kmipgt.distributed.attention import sharded_kmip_attention
from kmipgt.distributed.batch_norm import global_batch_norms
from kmipgt.distributed.choices import partitioned_attention_kinds, partitioned_local_kinds
from kmipgt.distributed.halo import HaloPlan, halo_exchange
from kmipgt.nn import GraphTransformer, KMIPCore
from kmipgt.ops import APPROXIMATE_BACKENDS, SEARCH_BACKENDS
from kmipgt.ops.ragged import RaggedLayout

__all__ = [
    "PartitionedGraphTransformer",
    "ShardedKMIPCore",
]


# Search options the sharded op takes: it searches every visiting key block exactly.
_SHARDED_SEARCH_OPTIONS = ("scale",)
_EXACT_BACKENDS = tuple(name for name in SEARCH_BACKENDS if name not in APPROXIMATE_BACKENDS)


class ShardedKMIPCore(KMIPCore):
    """The k-MIP core of ``core`` over the rows of every rank of ``group``, the whole graph one graph.

    Same options and (absent) parameters as ``core``; forward is :func:`sharded_kmip_attention`.
    """

    def __init__(self, core: KMIPCore, group: dist.ProcessGroup | None = None):
        unsupported = sorted(set(core.search) - set(_SHARDED_SEARCH_OPTIONS))
        if core.key_dropout:
            raise ValueError(
                "distributed.strategy 'graph' does not support model.attention.options.key_dropout"
            )
        if unsupported or core.backend not in _EXACT_BACKENDS:
            raise ValueError(
                "distributed.strategy 'graph' searches every rank's keys exactly: model.attention.options "
                f"may set an exact backend {_EXACT_BACKENDS} and scale, got backend {core.backend!r}"
                + (f" and {unsupported}" if unsupported else "")
            )
        super().__init__(
            core.heads, core.head_dim, core.dropout, k=core.k, backend=core.backend, **core.search
        )
        self.group = group

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor | None = None,
        batch: Tensor | None = None, layout: RaggedLayout | None = None,
    ) -> Tensor:
        return sharded_kmip_attention(
            query, key, value, self.k, group=self.group, scale=self.search.get("scale"),
            dropout_p=self._dropout_p(), backend=self.backend,
        )


def check_partitionable(model: torch.nn.Module) -> None:
    """ValueError unless ``model`` is a node-level GraphTransformer whose layers run on a partition."""
    if not isinstance(model, GraphTransformer):
        raise ValueError(
            f"distributed.strategy 'graph' trains GPS models (model.kind: gps), got {type(model).__name__}"
        )
    if model.task != "node":
        raise ValueError(f"distributed.strategy 'graph' trains node-level tasks, got task {model.task!r}")
    for layer in model.layers:
        if layer.local_kind not in partitioned_local_kinds():
            raise ValueError(
                f"distributed.strategy 'graph' runs the local MPNNs {partitioned_local_kinds()}, "
                f"got {layer.local_kind!r}"
            )
        if layer.attention_kind not in partitioned_attention_kinds():
            raise ValueError(
                f"distributed.strategy 'graph' runs the attention kinds {partitioned_attention_kinds()}, "
                f"got {layer.attention_kind!r}"
            )


class PartitionedGraphTransformer(torch.nn.Module):
    """``model`` on this rank's nodes of a partitioned graph (see the module doc), with the halo ``plan``.

    ``model`` is converted in place and its parameters are shared: k-MIP cores become
    :class:`ShardedKMIPCore`, BatchNorms :class:`~kmipgt.distributed.GlobalBatchNorm`, and each MPNN gets
    the halo rows through a forward pre-hook. Its state dict stays that of the one-process model.
    ``forward`` takes the shard's graph (``edge_index`` in ``[own; halo]`` rows) and returns the own
    nodes' predictions ``[n_r, out]``.
    """

    def __init__(self, model: GraphTransformer, plan: HaloPlan, group: dist.ProcessGroup | None = None):
        check_partitionable(model)
        super().__init__()
        self.model, self.plan, self.group = model, plan, group
        for layer in model.layers:
            if layer.local is not None:
                layer.local.register_forward_pre_hook(self._with_halo)
            if layer.attention is not None:
                layer.attention.core = ShardedKMIPCore(layer.attention.core, group)
        global_batch_norms(model)

    def _with_halo(self, module: torch.nn.Module, args: tuple) -> tuple:
        """The MPNN's input ``x`` (own rows) as the pair ``([own; halo], own)``."""
        x, *rest = args
        return ((halo_exchange(x, self.plan, self.group), x), *rest)

    def forward(
        self, x: Tensor, edge_index: Tensor, batch: Tensor | None = None, edge_attr: Tensor | None = None,
        lappe: Tensor | None = None, rwse: Tensor | None = None, edge_label_index: Tensor | None = None,
        ptr: Tensor | None = None,
    ) -> Tensor:
        """``x [n_r, F]``, ``edge_index [2, E_r]`` (sources in ``[own; halo]`` rows), ``edge_attr [E_r, F_e]``
        -> ``[n_r, out]``. ``batch``, ``edge_label_index`` and ``ptr`` are not read (one graph, node
        level)."""
        rows = self.plan.num_nodes + self.plan.num_halo
        h = self.model.embed(
            x, edge_index, edge_attr=edge_attr, lappe=lappe, rwse=rwse, num_source_nodes=rows
        )
        return self.model.head(h)
