"""Global attention: one query/key/value/output projection, one core per kind.

:class:`ProjectedAttention` projects node features to per-head tokens, hands them to the core of its kind
(registered in :mod:`kmipgt.nn.attention_kinds`: ``kmip``, ``full``, ``performer``, ``grf``; ``none`` means no
attention) and projects the result back. Kind-specific options (``k``, search options, random features, walk
options) are the core's ``attn_kwargs`` and pass through every layer above untouched, as in PyG's
``GPSConv(attn_type=..., attn_kwargs=...)``; the common sizes (channels, heads, head_dim, dropout) are
explicit. :class:`KMIPAttention`, :class:`FullAttention`, :class:`PerformerAttention` and
:class:`GRFAttention` fix the kind, for use in any PyG model:
``forward(x, edge_index=None, batch=None, qk_x=None) -> x'``.

Every module works on ragged PyG mini-batches (nodes of all graphs stacked, ``batch`` sorted) and never
pads: queries only see keys of their own graph. ``edge_index`` is accepted by all of them so that a
config can switch kinds freely; only topology-aware kinds (GRF) use it. ``qk_x`` is a separate input for
the queries and keys (e.g. positional encodings), the values still coming from ``x``; build the module
with ``qk_channels`` set to its size.
"""

from __future__ import annotations

import contextlib
import inspect

import torch
from torch import Tensor

from kmipgt.grf import CSRPattern
from kmipgt.grf.edge_sums import default_chunk_rows, normalised_kernel_attention_rows
from kmipgt.nn.attention_kinds import ATTENTION_KINDS, NO_ATTENTION, AttentionKind
from kmipgt.ops.ragged import RaggedLayout


def _core_attribute(name: str) -> property:
    """An attribute of the attention module that lives on its core (kind-specific state), read-write."""
    return property(
        lambda self: getattr(self.core, name),
        lambda self, value: setattr(self.core, name, value),
        doc=f"The core's ``{name}``.",
    )


def _at_least_float32(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 where it is in a half dtype (autocast's), else as it is (a float64 model)."""
    return tensor if tensor.dtype in (torch.float32, torch.float64) else tensor.float()


class ProjectedAttention(torch.nn.Module):
    r"""Multi-head global attention: projections shared by every kind around the core of one kind.

    .. math::
        \mathbf{o} = W_O \big\Vert_{h=1}^{H} \operatorname{core}\big(\mathbf{x}_{qk} W^h_Q,\,
        \mathbf{x}_{qk} W^h_K,\, \mathbf{x} W^h_V\big)

    with :math:`\mathbf{x}_{qk} = \mathbf{x}` unless ``qk_x`` is given. The kind is the subclass's
    ``attn_type`` or the ``attn_type`` argument; its core
    (:attr:`~kmipgt.nn.attention_kinds.AttentionKind.core`) is built from ``heads``, ``head_dim``,
    ``dropout`` and ``**attn_kwargs``. :func:`build_global_attention` builds the module of a kind.

    Args:
        channels: input and output size.
        heads: number of heads H.
        head_dim: size d of each head's query/key/value (default ``channels // heads``).
        dropout: attention dropout of the core, applied only in training.
        qk_channels: size of ``qk_x`` when queries and keys come from a separate input (default: ``x``).
        qk_dim: size of each head's queries and keys when it differs from the values' ``head_dim`` (the
            reference's City-Networks runs use 10 and 17): the search and the logits run in this width,
            the values keep theirs. (default: ``head_dim``)
        value_projection: project the values with :math:`W_V` (default). ``False`` uses the input's
            channels as values, head h reading channels :math:`[h d, (h + 1) d)` of :math:`\mathbf{x}`, so
            that each head's output is a weighted mean of hidden states; needs :math:`H d` = ``channels``.
        output_projection: project the heads' concatenated outputs back with :math:`W_O` (default).
            ``False`` returns the concatenation itself, as the reference's k-MIP models do
            (``head_agg: none``); needs :math:`H d` = ``channels``.
        attn_type: the registered kind (default: the subclass's own).
        **attn_kwargs: options of the kind's core.
    """

    attn_type: str | None = None
    dropout = _core_attribute("dropout")

    def __init__(
        self,
        channels: int,
        heads: int = 1,
        head_dim: int | None = None,
        dropout: float = 0.0,
        qk_channels: int | None = None,
        qk_dim: int | None = None,
        value_projection: bool = True,
        output_projection: bool = True,
        attn_type: str | None = None,
        **attn_kwargs,
    ):
        super().__init__()
        own = type(self).attn_type
        if attn_type is None and own is None:
            raise TypeError(f"{type(self).__name__} needs attn_type, the attention kind")
        if own is not None and attn_type not in (None, own):
            raise ValueError(f"{type(self).__name__} is attention kind {own!r}, got attn_type={attn_type!r}")
        self.attn_type = own or attn_type
        self.kind: AttentionKind = ATTENTION_KINDS.lookup(self.attn_type)
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
        qk_dim = head_dim if qk_dim is None else qk_dim
        if qk_dim <= 0:
            raise ValueError(f"qk_dim must be positive, got {qk_dim}")
        self.channels, self.qk_channels, self.heads, self.head_dim = channels, qk_channels, heads, head_dim
        self.qk_dim, self.value_projection = qk_dim, value_projection
        self.output_projection = output_projection
        inner = heads * head_dim
        projections = (("value_projection", value_projection), ("output_projection", output_projection))
        for name, projected in projections:
            if not projected and inner != channels:
                raise ValueError(
                    f"{name}=False needs heads * head_dim == channels, got {heads} * {head_dim} != {channels}"
                )
        self.lin_query = torch.nn.Linear(qk_channels, heads * qk_dim)
        self.lin_key = torch.nn.Linear(qk_channels, heads * qk_dim)
        self.lin_value = torch.nn.Linear(channels, inner) if value_projection else torch.nn.Identity()
        self.lin_out = torch.nn.Linear(inner, channels) if output_projection else torch.nn.Identity()
        # A core's own sizes (random features, projections) are those of the queries and keys.
        self.core = self.kind.core_class(heads, qk_dim, dropout, **attn_kwargs)
        # A kind registered with a core that reads only `batch` (the interface before layouts) still works.
        self._core_takes_layout = "layout" in inspect.signature(self.core.forward).parameters

    def reset_parameters(self) -> None:
        for lin in (self.lin_query, self.lin_key, self.lin_value, self.lin_out):
            if isinstance(lin, torch.nn.Linear):  # not the identities of value_/output_projection=False
                lin.reset_parameters()
        self.core.reset_parameters()

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
        """Query and key tokens ``[N, H, qk_dim]`` each, as the attention sees them.

        Under autocast they are projected in float32 all the same: the keys a search ranks, and so the keys
        a query attends, are then those of the float32 model. Half-precision projections round near-tied
        inner products apart, and a k-MIP query attends other keys (with k=5, outputs 8% off float32's).
        """
        shape = (x.size(0), self.heads, self.qk_dim)
        precision = contextlib.nullcontext()
        if torch.is_autocast_enabled(x.device.type):
            x, precision = _at_least_float32(x), torch.autocast(x.device.type, enabled=False)
        with precision:
            return self.lin_query(x).view(shape), self.lin_key(x).view(shape)

    def query_key_value(self, x: Tensor, qk_x: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """Query and key (from ``qk_x`` if given) tokens ``[N, H, qk_dim]`` and value tokens
        ``[N, H, head_dim]``, as the forward uses."""
        query, key = self.query_key(x if qk_x is None else qk_x)
        return query, key, self.lin_value(x).view(x.size(0), self.heads, self.head_dim)

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

    def forward(
        self,
        x: Tensor,
        edge_index: Tensor | None = None,
        batch: Tensor | None = None,
        qk_x: Tensor | None = None,
        layout: RaggedLayout | None = None,
    ) -> Tensor:
        """``x [N, channels]``, ``edge_index [2, E]``, sorted ``batch [N]``, ``qk_x [N, qk_channels]``
        -> ``[N, channels]``. ``layout``: the graphs of ``batch`` as built once per forward
        (:func:`~kmipgt.ops.ragged.batch_layout`); without it the core reads ``batch``."""
        self._check_input(x, batch, qk_x)
        if self.kind.edge_index and edge_index is None:
            raise ValueError(f"edge_index [2, E] is required by attention kind {self.attn_type!r}")
        precision = contextlib.nullcontext()
        if self.kind.float32_only:
            x, qk_x = _at_least_float32(x), None if qk_x is None else _at_least_float32(qk_x)
            precision = torch.autocast(x.device.type, enabled=False)
        attend = self._attend if self.kind.compiles else self._attend_eagerly
        with precision:
            return attend(x, edge_index, batch, qk_x, layout)

    @torch.compiler.disable
    def _attend_eagerly(
        self, x: Tensor, edge_index: Tensor | None, batch: Tensor | None, qk_x: Tensor | None,
        layout: RaggedLayout | None,
    ) -> Tensor:
        """:meth:`_attend` outside any compiled graph, for a kind the compiler cannot trace
        (``AttentionKind.compiles``): a compiled model breaks its graph on each side of it."""
        return self._attend(x, edge_index, batch, qk_x, layout)

    def _attend(
        self, x: Tensor, edge_index: Tensor | None, batch: Tensor | None, qk_x: Tensor | None,
        layout: RaggedLayout | None,
    ) -> Tensor:
        """The projections around the core, on checked inputs in the module's precision."""
        query, key, value = self.query_key_value(x, qk_x)
        graphs = (batch, layout) if self._core_takes_layout else (batch,)
        out = self.core(query, key, value, edge_index, *graphs)
        return self.lin_out(out.reshape(x.size(0), self.heads * self.head_dim))

    def __repr__(self) -> str:
        options = ", ".join(
            filter(None, [
                f"heads={self.heads}", f"head_dim={self.head_dim}",
                f"qk_dim={self.qk_dim}" if self.qk_dim != self.head_dim else "",
                "" if self.value_projection else "value_projection=False",
                "" if self.output_projection else "output_projection=False",
                self.core.extra_repr(),
            ])
        )
        return f"{self.__class__.__name__}({self.channels}, {options})"


class KMIPAttention(ProjectedAttention):
    r"""Exact k-MIP attention: each query attends to the ``k`` keys of its graph with largest inner product.

    .. math::
        \mathbf{o}_i = W_O \big\Vert_{h=1}^{H} \sum_{j \in T_k^h(i)}
        \operatorname{softmax}_j\!\Big(\frac{\mathbf{q}^h_i \cdot \mathbf{k}^h_j}{\sqrt{d}}\Big)
        \mathbf{v}^h_j

    where :math:`T_k^h(i)` are the ``k`` keys of :math:`i`'s graph with the largest
    :math:`\mathbf{q}^h_i \cdot \mathbf{k}^h_j` (all of them when the graph has at most ``k`` nodes).
    Memory is :math:`O(N k)` beyond the inputs; attention dropout acts on the k softmax weights.

    Arguments as :class:`ProjectedAttention`; ``**attn_kwargs`` are those of
    :class:`~kmipgt.nn.cores.KMIPCore`: ``k`` (default 16), ``backend`` and the search options of
    :func:`kmipgt.ops.kmip_attention` (``nlist``, ``nprobe``, ...). ``k``, ``backend``,
    ``keep_attention`` and ``last_attention`` are the core's, read and set through the module: with
    ``keep_attention`` set, ``last_attention`` holds the selection of the last forward.
    """

    attn_type = "kmip"
    k = _core_attribute("k")
    backend = _core_attribute("backend")
    keep_attention = _core_attribute("keep_attention")
    last_attention = _core_attribute("last_attention")


class FullAttention(ProjectedAttention):
    r"""Softmax attention over all nodes of the same graph (per-graph SDPA).

    .. math::
        \mathbf{o}_i = W_O \big\Vert_{h=1}^{H} \sum_{j \in g(i)}
        \operatorname{softmax}_j\!\Big(\frac{\mathbf{q}^h_i \cdot \mathbf{k}^h_j}{\sqrt{d}}\Big)
        \mathbf{v}^h_j

    Arguments as :class:`ProjectedAttention`; the core (:class:`~kmipgt.nn.cores.FullCore`) takes no
    options. With ``keep_attention`` set, ``last_attention`` holds the ``kept_keys`` largest weights per
    query (:func:`kmipgt.ops.full_attention_topk`).
    """

    attn_type = "full"
    keep_attention = _core_attribute("keep_attention")
    last_attention = _core_attribute("last_attention")
    kept_keys = _core_attribute("kept_keys")


class PerformerAttention(ProjectedAttention):
    r"""Linear attention with FAVOR+ positive orthogonal random features (Choromanski et al., 2021).

    .. math::
        \mathbf{o}_i = W_O \big\Vert_{h=1}^{H}
        \frac{\phi(\mathbf{q}^h_i)^\top \sum_{j \in g(i)} \phi(\mathbf{k}^h_j)\mathbf{v}_j^{h\top}}
        {\phi(\mathbf{q}^h_i)^\top \sum_{j \in g(i)} \phi(\mathbf{k}^h_j)}

    with the FAVOR+ features :math:`\phi` of :func:`kmipgt.grf.apply_feature_map`. Arguments as
    :class:`ProjectedAttention`; ``**attn_kwargs`` are those of :class:`~kmipgt.nn.cores.PerformerCore`
    (``num_features``). ``dropout`` acts on the attention output; ``core.redraw_projection()`` resamples
    the random features.
    """

    attn_type = "performer"


class GRFAttention(ProjectedAttention):
    r"""Linear attention masked by graph random features (Reid et al., ICLR 2025), in O(N).

    .. math::
        \mathbf{o}_i = W_O \big\Vert_{h=1}^{H}
        \frac{\sum_j \widehat{M}^h_{ij}\, \phi(\mathbf{q}^h_i)^\top \phi(\mathbf{k}^h_j)\,\mathbf{v}^h_j}
        {\sum_j \widehat{M}^h_{ij}\, \phi(\mathbf{q}^h_i)^\top \phi(\mathbf{k}^h_j)}

    with the learnable topological mask :math:`\widehat{M}` of :class:`~kmipgt.nn.grf_core.GRFCore`, built
    from random walks on ``edge_index`` (required). Arguments as :class:`ProjectedAttention` (``dropout``
    must be 0); ``**attn_kwargs`` are the core's walk and feature-map options (``num_walks``, ``p_halt``,
    ``max_len``, ``feature_map``, ``form``, ``global_weight``, ``seed``, ...). The sparse mask kernels
    (``sparse_sampled_addmm``) have no bfloat16/half version: under autocast this module runs in fp32.

    Without autograd (``torch.no_grad()``, ``torch.inference_mode()``) and on the core's fused route
    (ReLU features through the explicit mask, no global term: :meth:`GRFCore.fused_block_mask`), the
    whole layer runs a chunk of nodes at a time: queries, attention and output projection per chunk, keys
    and values projected a chunk at a time straight into their head-major layout. Of the ``[N, ·]``
    tensors only the key features, ``[v, 1]`` and the output are allocated whole (the autograd route
    allocates seven), so a call at large N takes fewer fresh pages from the allocator (docs/scaling.md,
    "GRF inference in node chunks"). Same result as the autograd route up to float rounding of the
    projections. Forward hooks on the projections then fire once per chunk, and those on ``core`` not at
    all.
    """

    attn_type = "grf"

    def _attend(
        self, x: Tensor, edge_index: Tensor | None, batch: Tensor | None, qk_x: Tensor | None,
        layout: RaggedLayout | None,
    ) -> Tensor:
        if not torch.is_grad_enabled():
            mask = self.core.fused_block_mask(edge_index, x.size(0), batch, layout)
            if mask is not None:
                return self._chunked_forward(x, x if qk_x is None else qk_x, *mask)
        return super()._attend(x, edge_index, batch, qk_x, layout)

    def _chunked_forward(self, x: Tensor, qk_x: Tensor, pattern: CSRPattern, weights: Tensor) -> Tensor:
        n, heads = x.size(0), self.heads
        phi_k = x.new_empty(heads, n, self.qk_dim)
        value1 = x.new_empty(heads, n, self.head_dim + 1)
        value1[..., -1] = 1.0
        # Chunks sized as the autograd route's, so that their temporaries stay about CHUNK_BYTES; every
        # row's sums use only that row, so the chunking does not change the result.
        chunk_nodes = default_chunk_rows(pattern, max(self.qk_dim, self.head_dim + 1), value1.element_size())
        chunks = [(start, min(start + chunk_nodes, n)) for start in range(0, n, chunk_nodes)]
        for start, stop in chunks:
            phi_k[:, start:stop] = self.lin_key(qk_x[start:stop]).view(-1, heads, self.qk_dim).transpose(0, 1)
            value = self.lin_value(x[start:stop]).view(-1, heads, self.head_dim)
            value1[:, start:stop, :-1] = value.transpose(0, 1)
        phi_k = phi_k.relu_().view(heads * n, -1)
        value1 = value1.view(heads * n, -1)
        out = x.new_empty(n, self.channels)
        for start, stop in chunks:
            query = self.lin_query(qk_x[start:stop]).view(-1, heads, self.qk_dim)
            attended = normalised_kernel_attention_rows(
                pattern, weights, query, phi_k, value1, start, eps=self.core.eps
            )
            out[start:stop] = self.lin_out(attended.view(stop - start, -1))
        return out


def build_global_attention(
    kind: str,
    channels: int,
    heads: int = 1,
    *,
    head_dim: int | None = None,
    dropout: float = 0.0,
    qk_channels: int | None = None,
    attn_kwargs: dict | None = None,
) -> ProjectedAttention | None:
    """Global attention module of the given ``kind``: its registered module (or :class:`ProjectedAttention`)
    around its core; ``None`` for ``"none"``.

    Args:
        kind: a registered kind (:data:`~kmipgt.nn.attention_kinds.ATTENTION_KINDS`) or ``"none"``.
        channels, heads, head_dim, dropout, qk_channels: see :class:`ProjectedAttention`.
        attn_kwargs: options of the kind's core, e.g. ``{"k": 16, "backend": "ivf"}`` for ``"kmip"``;
            ignored for ``"none"``.
    """
    if kind == NO_ATTENTION:
        return None
    module = ATTENTION_KINDS.lookup(kind).module_class or ProjectedAttention
    return module(channels, heads, head_dim, dropout, qk_channels, attn_type=kind, **(attn_kwargs or {}))
