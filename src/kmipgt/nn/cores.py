"""Attention cores: what each global attention kind does with per-head query, key and value tokens.

A core maps node-major tokens ``query, key [N, H, d]`` and ``value [N, H, d_v]`` of ragged PyG graphs to
``[N, H, d_v]`` through ``forward(query, key, value, edge_index=None, batch=None)``; it never sees the node
features nor the projections, which :class:`~kmipgt.nn.attention.ProjectedAttention` shares between
kinds. Each core is built from the common sizes ``(heads, head_dim, dropout)`` and its kind-specific
options (``attn_kwargs``), so a config can switch kinds and a benchmark can feed all of them the same
tokens. The GRF core lives in :mod:`kmipgt.nn.grf_core`.
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt import ops
from kmipgt.grf import linear_attention, orthogonal_random_features
from kmipgt.ops.ragged import RaggedLayout
from kmipgt.ops.search.ivf_common import check_recall

__all__ = ["AttentionCore", "FullCore", "KMIPCore", "PerformerCore"]


def _graphs(batch: Tensor | None, layout: RaggedLayout | None) -> dict:
    """The keyword that gives an op the graphs of a forward: its layout where the model built one."""
    return {"batch": batch} if layout is None else {"layout": layout}


class AttentionCore(torch.nn.Module):
    """Base of the attention cores: the common sizes, and no parameters unless the kind has its own.

    Args:
        heads: number of heads H of the tokens.
        head_dim: size d of each head's queries and keys (the values may differ).
        dropout: attention dropout, applied only in training (how depends on the kind).
    """

    def __init__(self, heads: int, head_dim: int, dropout: float = 0.0, **options):
        super().__init__()
        # Kinds with options take them in their own signature; this names the kind that has none.
        if options:
            raise TypeError(f"{type(self).__name__} takes no options, got {sorted(options)}")
        self.heads, self.head_dim, self.dropout = heads, head_dim, dropout

    def reset_parameters(self) -> None:
        """Nothing to reset unless the kind has parameters or random features."""

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        edge_index: Tensor | None = None,
        batch: Tensor | None = None,
        layout: RaggedLayout | None = None,
    ) -> Tensor:
        """``query, key [N, H, d]``, ``value [N, H, d_v]``, ``edge_index [2, E]``, sorted ``batch [N]``
        -> ``[N, H, d_v]``. ``layout``: the graphs of ``batch``, built once per forward
        (:func:`~kmipgt.ops.ragged.batch_layout`); without it they are read from ``batch``."""
        raise NotImplementedError

    def _dropout_p(self) -> float:
        return self.dropout if self.training else 0.0


# Arguments of ops.kmip_attention that KMIPCore fills itself; every other keyword (nlist, nprobe, scale,
# check_finite, ...) is a search option passed through unchanged, so one that ops gains needs no change here.
_KMIP_OWN_ARGS = {
    "query", "key", "value", "k", "ptr", "batch", "key_ptr", "key_batch", "dropout_p", "backend",
    "return_selection", "calibration", "layout",
}
KMIP_SEARCH_OPTIONS = tuple(
    name for name in inspect.signature(ops.kmip_attention).parameters if name not in _KMIP_OWN_ARGS
)


class KMIPCore(AttentionCore):
    r"""k-MIP attention (:func:`kmipgt.ops.kmip_attention`): each query attends to the ``k`` keys of its
    graph with the largest inner product.

    .. math::
        \mathbf{o}^h_i = \sum_{j \in T_k^h(i)}
        \operatorname{softmax}_j\!\Big(\frac{\mathbf{q}^h_i \cdot \mathbf{k}^h_j}{\sqrt{d}}\Big)\mathbf{v}^h_j

    where :math:`T_k^h(i)` are the ``k`` keys of :math:`i`'s graph with the largest
    :math:`\mathbf{q}^h_i \cdot \mathbf{k}^h_j` (all of them when the graph has at most ``k`` nodes).
    Attention dropout acts on the k softmax weights. Key dropout (DropEdge for attention) acts before the
    search: in training each key leaves it, with its value, with probability ``key_dropout``, so a query
    attends to the top-k of the keys that remain and cannot lean on the same few keys every step.

    Args:
        heads, head_dim, dropout: see :class:`AttentionCore`.
        k: keys kept per query and head. (default: :obj:`16`)
        backend: key-search backend of :func:`kmipgt.ops.topk_inner_product`. (default: :obj:`"auto"`)
        key_dropout: probability that a key (all heads at once) is left out of a training forward's
            search. (default: :obj:`0.0`)
        **search: the other options of :func:`kmipgt.ops.kmip_attention` (:data:`KMIP_SEARCH_OPTIONS`:
            ``nlist``/``nprobe`` of the approximate backends, ``scale``, ...), passed on unchanged.

    With ``keep_attention`` set, ``last_attention`` holds the selection the forward used (searched key
    indices, scores, softmax weights; ``return_selection`` of :func:`kmipgt.ops.kmip_attention`).
    With an approximate backend (``"ivf"``, ``"faiss"``) and no fixed ``nprobe``, probing is calibrated on
    every forward to the ``recall`` target (default 0.95) and ``last_recall`` holds the mean sampled recall
    it reached over the (graph, head) indexes (None before the first such forward, or when every graph was
    searched exactly: graphs under 1,024 keys, or ``recall=1.0``).
    """

    keep_attention: bool = False
    last_attention: ops.AttentionSelection | None = None
    last_recall: float | None = None

    def __init__(
        self, heads: int, head_dim: int, dropout: float = 0.0, k: int = 16, backend: str = "auto",
        key_dropout: float = 0.0, **search
    ):
        super().__init__(heads, head_dim, dropout)
        if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
            raise ValueError(f"k must be a positive int, got {k!r}")
        if not 0.0 <= key_dropout < 1.0:
            raise ValueError(f"key_dropout must be in [0, 1), got {key_dropout}")
        unknown = sorted(set(search) - set(KMIP_SEARCH_OPTIONS))
        if unknown:
            raise TypeError(
                f"unknown k-MIP attention options {unknown}; "
                f"known: k, backend, {', '.join(KMIP_SEARCH_OPTIONS)}"
            )
        check_recall(search.get("recall"), search.get("nprobe"))
        self.k, self.backend, self.key_dropout, self.search = k, backend, key_dropout, search

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor | None = None,
        batch: Tensor | None = None, layout: RaggedLayout | None = None,
    ) -> Tensor:
        calibrated = self.backend in ops.APPROXIMATE_BACKENDS and self.search.get("nprobe") is None
        calibration = ops.ProbeCalibration() if calibrated else None
        where = _graphs(batch, layout)
        kept = None
        if self.training and self.key_dropout > 0:
            if layout is None:
                layout = RaggedLayout.from_ptr(query.shape[0], query.device, batch=batch)
            kept, key_ptr = self._kept_keys(key.shape[0], layout)
            key, value = key[kept], value[kept]
            where = {"ptr": layout.ptr, "key_ptr": key_ptr}
        # Inputs come from the model's own projections; a non-finite loss is reported by the training loop,
        # so the per-call finiteness check (which waits for a CUDA device) stays out of the forward.
        options = {"check_finite": False, **self.search}
        out = ops.kmip_attention(
            query,
            key,
            value,
            self.k,
            **where,
            dropout_p=self._dropout_p(),
            backend=self.backend,
            return_selection=self.keep_attention,
            calibration=calibration,
            **options,
        )
        if calibration is not None:
            self.last_recall = calibration.mean_recall
        if self.keep_attention:
            out, selection = out
            if kept is not None:  # back from positions among the kept keys to the caller's rows
                index = torch.where(selection.index >= 0, kept[selection.index.clamp_min(0)], -1)
                selection = selection._replace(index=index)
            self.last_attention = selection
        return out

    def _kept_keys(self, num_keys: int, layout: RaggedLayout) -> tuple[Tensor, Tensor]:
        """Rows ``[N']`` of the keys that stay in this forward's search, and their CPU ``key_ptr [G + 1]``."""
        kept = (torch.rand(num_keys, device=layout.device) >= self.key_dropout).nonzero().squeeze(1)
        graph, _ = layout.node_graph_position()
        counts = torch.bincount(graph[kept], minlength=layout.num_graphs).cpu()
        return kept, F.pad(counts.cumsum(0), (1, 0))

    def extra_repr(self) -> str:
        dropout = f", key_dropout={self.key_dropout}" if self.key_dropout else ""
        options = "".join(f", {name}={value!r}" for name, value in self.search.items())
        return f"k={self.k}, backend={self.backend!r}{dropout}{options}"


class FullCore(AttentionCore):
    r"""Softmax attention over all nodes of the same graph (:func:`kmipgt.ops.full_attention`).

    .. math::
        \mathbf{o}^h_i = \sum_{j \in g(i)}
        \operatorname{softmax}_j\!\Big(\frac{\mathbf{q}^h_i \cdot \mathbf{k}^h_j}{\sqrt{d}}\Big)\mathbf{v}^h_j

    Args:
        heads, head_dim, dropout: see :class:`AttentionCore`; no other options.

    With ``keep_attention`` set, ``last_attention`` holds the ``kept_keys`` largest weights per query
    (:func:`kmipgt.ops.full_attention_topk`: renormalised over them, with the full-softmax ``mass``).
    """

    keep_attention: bool = False
    last_attention: ops.AttentionSelection | None = None
    kept_keys: int = 16

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor | None = None,
        batch: Tensor | None = None, layout: RaggedLayout | None = None,
    ) -> Tensor:
        out = ops.full_attention(
            query, key, value, **_graphs(batch, layout), dropout_p=self._dropout_p(), check_finite=False
        )
        if self.keep_attention:
            graphs = {"batch": batch} if layout is None else {"ptr": layout.ptr}
            self.last_attention = ops.full_attention_topk(query, key, self.kept_keys, **graphs)
        return out


class PerformerCore(AttentionCore):
    r"""Linear attention with FAVOR+ positive orthogonal random features (Choromanski et al., 2021).

    .. math::
        \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top \sum_{j \in g(i)} \phi(\mathbf{k}_j)\mathbf{v}_j^\top}
        {\phi(\mathbf{q}_i)^\top \sum_{j \in g(i)} \phi(\mathbf{k}_j)},
        \qquad \phi(\mathbf{x}) = m^{-1/2}\exp\!\big(W\mathbf{x}' - \lVert\mathbf{x}'\rVert^2/2\big),
        \quad \mathbf{x}' = d^{-1/4}\mathbf{x}

    per head, with :math:`W \in \mathbb{R}^{m \times d}` from
    :func:`kmipgt.grf.orthogonal_random_features`, so :math:`\phi(\mathbf{q})^\top\phi(\mathbf{k})` is
    unbiased for :math:`\exp(\mathbf{q}^\top\mathbf{k}/\sqrt{d})`; computed by
    :func:`kmipgt.grf.linear_attention` with the ``"favor+"`` feature map, key sums per graph.
    Call :meth:`redraw_projection` to resample :math:`W` (the trainer does, once per epoch).

    Args:
        heads, head_dim: see :class:`AttentionCore`.
        dropout: dropout on the attention output (the weights are never materialised, so they cannot be
            dropped individually).
        num_features: number of random features m. (default: :math:`\max(d, \lceil d \log d \rceil)`)
    """

    def __init__(self, heads: int, head_dim: int, dropout: float = 0.0, num_features: int | None = None):
        super().__init__(heads, head_dim, dropout)
        self.num_features = num_features or max(head_dim, math.ceil(head_dim * math.log(max(head_dim, 2))))
        self.register_buffer("projection", orthogonal_random_features(self.num_features, head_dim))

    @torch.no_grad()
    def redraw_projection(self) -> None:
        """Resample the random features :math:`W` in place."""
        self.projection.copy_(
            orthogonal_random_features(self.num_features, self.head_dim, device=self.projection.device)
        )

    def reset_parameters(self) -> None:
        self.redraw_projection()

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor | None = None,
        batch: Tensor | None = None, layout: RaggedLayout | None = None,
    ) -> Tensor:
        out = linear_attention(
            query, key, value, feature_map="favor+", projection=self.projection, **_graphs(batch, layout)
        )
        return F.dropout(out, self.dropout, self.training)

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}"
