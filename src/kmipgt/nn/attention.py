"""Global attention modules behind one interface: ``forward(x, batch=None, edge_index=None) -> x'``.

Every module works on ragged PyG mini-batches (nodes of all graphs stacked, ``batch`` sorted) and never
pads: queries only see keys of their own graph. ``edge_index`` is accepted by all of them so that a
config can switch kinds freely; only topology-aware kinds (GRF) use it. The projection-based kinds also
take ``qk_x``: a separate input for the queries and keys (e.g. positional encodings), the values still
coming from ``x``; build them with ``qk_channels`` set to its size.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch_geometric.nn.attention.performer import orthogonal_matrix
from torch_geometric.utils import scatter

from kmipgt import ops
from kmipgt.nn.grf_attention import GRFAttention


class _MultiHeadProjections(torch.nn.Module):
    """Shared q/k/v projections to H heads and the output projection back to ``channels``.

    ``qk_channels`` (default ``channels``) is the size of the input the queries and keys are projected from.
    """

    # Inspection hook of the kinds with explicit weights (k-MIP, full): while ``keep_attention`` is true,
    # each forward stores the keys and softmax weights it used in ``last_attention``.
    keep_attention: bool = False
    last_attention: ops.AttentionSelection | None = None

    def __init__(
        self,
        channels: int,
        heads: int,
        head_dim: int | None = None,
        dropout: float = 0.0,
        qk_channels: int | None = None,
    ):
        super().__init__()
        if channels <= 0:
            raise ValueError(f"channels must be positive, got {channels}")
        if heads <= 0:
            raise ValueError(f"heads must be positive, got {heads}")
        if head_dim is None:
            if channels % heads != 0:
                raise ValueError(
                    f"channels ({channels}) must be divisible by heads ({heads}) when head_dim is not given"
                )
            head_dim = channels // heads
        if head_dim <= 0:
            raise ValueError(f"head_dim must be positive, got {head_dim}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        qk_channels = channels if qk_channels is None else qk_channels
        if qk_channels <= 0:
            raise ValueError(f"qk_channels must be positive, got {qk_channels}")
        self.channels = channels
        self.qk_channels = qk_channels
        self.heads = heads
        self.head_dim = head_dim
        self.dropout = dropout
        inner = heads * head_dim
        self.lin_query = torch.nn.Linear(qk_channels, inner)
        self.lin_key = torch.nn.Linear(qk_channels, inner)
        self.lin_value = torch.nn.Linear(channels, inner)
        self.lin_out = torch.nn.Linear(inner, channels)

    def reset_parameters(self) -> None:
        for lin in (self.lin_query, self.lin_key, self.lin_value, self.lin_out):
            lin.reset_parameters()

    @torch.no_grad()
    def tie_query_key(self) -> None:
        r"""Start keys as a copy of the query projection, both without bias (the two still train apart).

        Then :math:`\mathbf{q}_i \cdot \mathbf{k}_j = \mathbf{x}_i^\top W^\top W \mathbf{x}_j` is a
        positive semi-definite kernel, largest for inputs alike: when queries and keys come from
        positional encodings, the first top-k of each query is its spatial neighbourhood. Independent
        random projections instead select keys unrelated to the query, and since the top-k selection
        passes no gradient, training never finds the useful keys from there.
        """
        self.lin_key.weight.copy_(self.lin_query.weight)
        self.lin_query.bias.zero_()
        self.lin_key.bias.zero_()

    def query_key(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Query and key tokens ``[N, H, head_dim]`` each, as the attention sees them."""
        shape = (x.size(0), self.heads, self.head_dim)
        return self.lin_query(x).view(shape), self.lin_key(x).view(shape)

    def query_key_value(self, x: Tensor, qk_x: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Query, key (from ``qk_x`` if given) and value tokens ``[N, H, head_dim]``, as the forward uses."""
        query, key = self.query_key(x if qk_x is None else qk_x)
        return query, key, self.lin_value(x).view(query.shape)

    def _merge_heads(self, out: Tensor) -> Tensor:
        return self.lin_out(out.reshape(out.size(0), self.heads * self.head_dim))

    def _check_input(self, x: Tensor, batch: Tensor | None, qk_x: Tensor | None = None) -> None:
        if x.dim() != 2 or x.size(-1) != self.channels:
            raise ValueError(f"x must have shape [N, {self.channels}], got {list(x.shape)}")
        if batch is not None and batch.shape != (x.size(0),):
            raise ValueError(f"batch must have shape [{x.size(0)}], got {list(batch.shape)}")
        # Without qk_x the queries and keys come from x, which fits only when qk_channels == channels.
        qk_shape = (x.size(0), self.qk_channels)
        got = tuple((x if qk_x is None else qk_x).shape)
        if got != qk_shape:
            raise ValueError(f"qk_x must have shape {list(qk_shape)}, got {None if qk_x is None else got}")

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.channels}, heads={self.heads}, head_dim={self.head_dim})"


class KMIPAttention(_MultiHeadProjections):
    r"""Exact k-MIP attention: each query attends to the ``k`` keys of its graph with largest inner product.

    .. math::
        \mathbf{o}_i = W_O \big\Vert_{h=1}^{H} \sum_{j \in T_k^h(i)}
        \operatorname{softmax}_j\!\Big(\frac{\mathbf{q}^h_i \cdot \mathbf{k}^h_j}{\sqrt{d}}\Big)
        \mathbf{v}^h_j

    where :math:`T_k^h(i)` are the ``k`` keys of :math:`i`'s graph with the largest
    :math:`\mathbf{q}^h_i \cdot \mathbf{k}^h_j` (all of them when the graph has at most ``k`` nodes).
    Memory is :math:`O(N k)` beyond the inputs; attention dropout acts on the k softmax weights.

    Args:
        channels: input and output size.
        heads: number of heads H.
        k: keys kept per query and head.
        head_dim: size d of each head's query/key/value (default ``channels // heads``).
        dropout: dropout on the attention weights, applied only in training.
        backend: search backend passed to :func:`kmipgt.ops.kmip_attention`.
        qk_channels: size of ``qk_x`` when queries and keys come from a separate input (default: ``x``).

    With ``keep_attention`` set, ``last_attention`` holds the selection the forward used (searched key
    indices, scores, softmax weights; ``return_selection`` of :func:`kmipgt.ops.kmip_attention`).
    """

    def __init__(
        self,
        channels: int,
        heads: int,
        k: int,
        head_dim: int | None = None,
        dropout: float = 0.0,
        backend: str = "auto",
        qk_channels: int | None = None,
    ):
        super().__init__(channels, heads, head_dim, dropout, qk_channels)
        if not isinstance(k, int) or k <= 0:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k = k
        self.backend = backend

    def forward(
        self,
        x: Tensor,
        batch: Tensor | None = None,
        edge_index: Tensor | None = None,
        qk_x: Tensor | None = None,
    ) -> Tensor:
        self._check_input(x, batch, qk_x)
        query, key, value = self.query_key_value(x, qk_x)
        out = ops.kmip_attention(
            query,
            key,
            value,
            self.k,
            batch=batch,
            dropout_p=self.dropout if self.training else 0.0,
            backend=self.backend,
            return_selection=self.keep_attention,
        )
        if self.keep_attention:
            out, self.last_attention = out
        return self._merge_heads(out)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.channels}, heads={self.heads}, head_dim={self.head_dim}, "
            f"k={self.k})"
        )


class FullAttention(_MultiHeadProjections):
    r"""Softmax attention over all nodes of the same graph (per-graph SDPA).

    .. math::
        \mathbf{o}_i = W_O \big\Vert_{h=1}^{H} \sum_{j \in g(i)}
        \operatorname{softmax}_j\!\Big(\frac{\mathbf{q}^h_i \cdot \mathbf{k}^h_j}{\sqrt{d}}\Big)
        \mathbf{v}^h_j

    Args:
        channels: input and output size.
        heads: number of heads H.
        head_dim: size of each head (default ``channels // heads``).
        dropout: dropout on the attention weights, applied only in training.
        qk_channels: size of ``qk_x`` when queries and keys come from a separate input (default: ``x``).

    With ``keep_attention`` set, ``last_attention`` holds the ``kept_keys`` largest weights per query
    (:func:`kmipgt.ops.full_attention_topk`: renormalised over them, with the full-softmax ``mass``).
    """

    kept_keys: int = 16

    def forward(
        self,
        x: Tensor,
        batch: Tensor | None = None,
        edge_index: Tensor | None = None,
        qk_x: Tensor | None = None,
    ) -> Tensor:
        self._check_input(x, batch, qk_x)
        query, key, value = self.query_key_value(x, qk_x)
        out = ops.full_attention(
            query, key, value, batch=batch, dropout_p=self.dropout if self.training else 0.0
        )
        if self.keep_attention:
            self.last_attention = ops.full_attention_topk(query, key, self.kept_keys, batch=batch)
        return self._merge_heads(out)


class PerformerAttention(_MultiHeadProjections):
    r"""Linear attention with FAVOR+ positive orthogonal random features (Choromanski et al., 2021).

    With :math:`\phi(\mathbf{x}) = m^{-1/2}\exp(W\mathbf{x} - \lVert\mathbf{x}\rVert^2/2)` applied to
    :math:`d^{-1/4}`-scaled queries and keys, :math:`W \in \mathbb{R}^{m \times d}` random orthogonal rows,

    .. math::
        \mathbf{o}_i = \frac{\phi(\mathbf{q}_i)^\top \sum_{j \in g(i)} \phi(\mathbf{k}_j)\mathbf{v}_j^\top}
        {\phi(\mathbf{q}_i)^\top \sum_{j \in g(i)} \phi(\mathbf{k}_j)}

    The key sums run per graph (scatter over ``batch``), so no key leaks into another graph's output.
    Call :meth:`redraw_projection` to resample :math:`W` (e.g. once per epoch).

    Args:
        channels: input and output size.
        heads: number of heads H.
        head_dim: size of each head (default ``channels // heads``).
        num_features: number of random features m (default ``ceil(d log d)``).
        dropout: dropout on the attention output, applied only in training (the weights are never
            materialised, so they cannot be dropped individually).
        qk_channels: size of ``qk_x`` when queries and keys come from a separate input (default: ``x``).
    """

    def __init__(
        self,
        channels: int,
        heads: int,
        head_dim: int | None = None,
        num_features: int | None = None,
        dropout: float = 0.0,
        qk_channels: int | None = None,
    ):
        super().__init__(channels, heads, head_dim, dropout, qk_channels)
        d = self.head_dim
        self.num_features = num_features or max(d, math.ceil(d * math.log(max(d, 2))))
        self.register_buffer("projection", orthogonal_matrix(self.num_features, d))

    @torch.no_grad()
    def redraw_projection(self) -> None:
        """Resample the orthogonal random feature matrix in place."""
        self.projection.copy_(orthogonal_matrix(self.num_features, self.head_dim))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self.redraw_projection()

    def _log_features(self, x: Tensor) -> Tensor:
        """``log(sqrt(m)·phi(x))`` for ``x [N, H, d]`` -> ``[N, H, m]``."""
        x = x * self.head_dim**-0.25
        return x @ self.projection.t() - 0.5 * (x * x).sum(-1, keepdim=True)

    def forward(
        self,
        x: Tensor,
        batch: Tensor | None = None,
        edge_index: Tensor | None = None,
        qk_x: Tensor | None = None,
    ) -> Tensor:
        self._check_input(x, batch, qk_x)
        query, key, value = self.query_key_value(x, qk_x)
        if batch is None:
            batch = x.new_zeros(x.size(0), dtype=torch.long)
        num_graphs = int(batch.max()) + 1 if batch.numel() > 0 else 0
        eps = 1e-6
        # Stabilisers cancel in the ratio: per query row for phi(q), per graph and head for phi(k).
        log_q = self._log_features(query)
        phi_q = torch.exp(log_q - log_q.amax(-1, keepdim=True).detach()) + eps
        log_k = self._log_features(key)
        key_max = scatter(log_k.amax(-1).detach(), batch, dim=0, dim_size=num_graphs, reduce="max")
        phi_k = torch.exp(log_k - key_max[batch].unsqueeze(-1)) + eps
        kv = scatter(phi_k.unsqueeze(-1) * value.unsqueeze(-2), batch, dim=0, dim_size=num_graphs)
        k_sum = scatter(phi_k, batch, dim=0, dim_size=num_graphs)
        numerator = torch.einsum("nhm,nhmd->nhd", phi_q, kv[batch])
        denominator = (phi_q * k_sum[batch]).sum(-1, keepdim=True)
        out = numerator / denominator
        out = torch.nn.functional.dropout(out, self.dropout, self.training)
        return self._merge_heads(out)

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.channels}, heads={self.heads}, head_dim={self.head_dim}, "
            f"num_features={self.num_features})"
        )


ATTENTION_KINDS = ("kmip", "full", "performer", "grf", "none")


def build_global_attention(
    kind: str,
    channels: int,
    heads: int,
    *,
    k: int | None = None,
    head_dim: int | None = None,
    dropout: float = 0.0,
    **extra,
) -> torch.nn.Module | None:
    """Global attention module of the given ``kind``; ``None`` for ``"none"``.

    Args:
        kind: one of :data:`ATTENTION_KINDS`.
        channels: input and output size.
        heads: number of heads.
        k: keys per query; required by ``"kmip"``, ignored by the kinds that attend to all keys.
        head_dim: size of each head (default ``channels // heads``).
        dropout: attention dropout, applied only in training.
        **extra: kind-specific options (``backend`` for k-MIP, ``num_features`` for Performer, the walk and
            feature-map options of :class:`~kmipgt.nn.grf_attention.GRFAttention` for GRF) and
            ``qk_channels`` for the kinds that project queries and keys (not GRF).
    """
    if kind == "none":
        return None
    if kind == "kmip":
        if k is None:
            raise ValueError("k is required for attention kind 'kmip'")
        return KMIPAttention(channels, heads, k, head_dim=head_dim, dropout=dropout, **extra)
    if kind == "full":
        return FullAttention(channels, heads, head_dim=head_dim, dropout=dropout, **extra)
    if kind == "performer":
        return PerformerAttention(channels, heads, head_dim=head_dim, dropout=dropout, **extra)
    if kind == "grf":
        if dropout != 0.0:
            raise ValueError("attention kind 'grf' has no attention dropout; set attn_dropout to 0")
        if extra.pop("qk_channels", None) is not None:
            raise ValueError("attention kind 'grf' takes queries and keys from the hidden state only")
        return GRFAttention(channels, heads, head_channels=head_dim, **extra)
    raise ValueError(f"attention kind must be one of {ATTENTION_KINDS}, got {kind!r}")
