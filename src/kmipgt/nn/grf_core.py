"""The GRF attention core: linear attention masked by graph random features, in O(N) (kind ``grf``).

The walks behind the mask depend only on the graph and the walk settings, so the GRF cores of one model
share them: :class:`GRFWalkCache` holds one graph's walks and mask pattern, and :func:`share_walk_caches`
hands one cache to every core of a model that samples alike. Each core keeps its own modulation f and
random features. One shared cache with int32 indices instead of one per layer is what lets a deep GRF
model hold a London-size graph (docs/scaling.md, "GRF walks").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt.grf import (
    FEATURE_MAPS,
    CSRPattern,
    GRFMaskPattern,
    GRFWalks,
    asymmetric_masked_attention,
    block_mask,
    grf_feature_values,
    grf_features,
    grf_mask_pattern,
    masked_linear_attention,
    orthogonal_random_features,
    pattern_masked_attention,
    sample_walks,
)
from kmipgt.grf.edge_sums import FUSED_FEATURE_MAPS
from kmipgt.grf.sparse import index_dtype
from kmipgt.nn.cores import AttentionCore
from kmipgt.ops.ragged import RaggedLayout, graph_ptr

__all__ = ["GRFCore", "GRFWalkCache", "WalkSettings", "share_walk_caches"]


@dataclass(frozen=True)
class WalkSettings:
    """What the walks of a graph depend on besides the graph (arguments of :func:`kmipgt.grf.sample_walks`).

    ``seed`` seeds the first graph; the k-th new graph after it takes ``seed + k`` (``None``: fresh draws).
    """

    num_walks: int
    p_halt: float
    max_len: int
    antithetic: bool
    repelling: bool
    seed: int | None


class GRFWalkCache:
    """One graph's walks, sampled on first use and kept while the same graph comes back.

    Holds the walks, the explicit mask's pattern (built when a core first asks for it) and a compact copy
    of the graph's ``edge_index`` to recognise it: int32 ``[2, E]`` (8 bytes per edge, half of an int64
    clone), compared in full on every call (``torch.equal`` compares across integer dtypes exactly), so
    a different graph, or the same tensor changed in place, is always resampled, never served stale walks.

    Args:
        settings: the walk settings; the cache samples only with these.
    """

    def __init__(self, settings: WalkSettings) -> None:
        self.settings = settings
        self.graphs_sampled = 0
        self.clear()

    def clear(self) -> None:
        """Forget the cached graph, walks and pattern (the seed sequence goes on: the next graph takes
        the next seed)."""
        self._graph: Tensor | None = None
        self._walks: GRFWalks | None = None
        self._pattern: GRFMaskPattern | None = None
        self._products: int | None = None

    def walks(self, edge_index: Tensor, num_nodes: int, ptr: Tensor | None = None) -> GRFWalks:
        """Walks on ``edge_index`` ``[2, E]`` over ``num_nodes`` nodes (``ptr`` ``[G + 1]``: a batch's graph
        offsets, checked so that no walk crosses graphs): the cached ones if this is the cached graph."""
        if self._walks is not None and self._walks.num_nodes == num_nodes and self._same_graph(edge_index):
            return self._walks
        settings = self.settings
        seed = None if settings.seed is None else settings.seed + self.graphs_sampled
        # Drop the old walks first: sampling the new ones must not hold both sets at once.
        self.clear()
        walks = sample_walks(
            edge_index, num_nodes, num_walks=settings.num_walks, p_halt=settings.p_halt,
            max_len=settings.max_len, seed=seed, ptr=ptr, antithetic=settings.antithetic,
            repelling=settings.repelling,
        )
        self.graphs_sampled += 1
        self._graph, self._walks = _compact_copy(edge_index, num_nodes), walks
        return walks

    def _same_graph(self, edge_index: Tensor) -> bool:
        graph = self._graph
        return (
            graph is not None
            and graph.shape == edge_index.shape
            and graph.device == edge_index.device
            and torch.equal(graph, edge_index)
        )

    def num_products(self) -> int:
        """``Σ_u c_u²`` for ``c_u`` visits of the cached walks to node u: the products that sum into the
        explicit mask ``M̂ = Φ̂Φ̂ᵀ`` (an upper bound on its nonzeros), computed once per set of walks."""
        if self._walks is None:
            raise RuntimeError("no walks cached: call walks() first")
        if self._products is None:
            visits = torch.bincount(self._walks.pairs[1], minlength=self._walks.num_nodes)
            self._products = int((visits * visits).sum())
        return self._products

    def nbytes(self) -> int:
        """Bytes of the tensors the cache holds: graph copy, walks and pattern, with their per-H layouts."""
        tensors = [] if self._graph is None else [self._graph]
        if self._walks is not None:
            tensors += [getattr(self._walks, name) for name in _WALK_TENSORS]
            tensors += list(self._walks._head_indices.values())
        if self._pattern is not None:
            tensors += [self._pattern.indices, self._pattern.left, self._pattern.right, self._pattern.entry]
            for block in self._pattern._block_patterns.values():
                tensors += [block.row, block.crow, block.col]
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        return sum(storages.values())

    def mask_pattern(self) -> GRFMaskPattern:
        """The pattern of ``M̂ = Φ̂Φ̂ᵀ`` for the cached walks (:func:`kmipgt.grf.grf_mask_pattern`), built
        on first request."""
        if self._walks is None:
            raise RuntimeError("no walks cached: call walks() first")
        if self._pattern is None:
            self._pattern = grf_mask_pattern(self._walks)
        return self._pattern


_WALK_TENSORS = ("step", "start", "node", "load", "pairs", "pair_index")


def _compact_copy(edge_index: Tensor, num_nodes: int) -> Tensor:
    """A copy of ``edge_index`` to compare later graphs with: int32 where node ids fit (always a copy,
    never a view, so that a change to the caller's tensor cannot change it)."""
    return edge_index.detach().to(dtype=index_dtype(num_nodes - 1), copy=True)


def share_walk_caches(model: torch.nn.Module) -> int:
    """Give the GRF cores of ``model`` that sample alike (equal :class:`WalkSettings`) one walk cache.

    Cores built with ``share_walks=False`` keep their own. Outputs do not change where the cores would
    have sampled the same walks anyway (same seed); with ``seed=None`` the layers now see one random set
    of walks instead of one each. Returns the number of caches the shared cores use.
    """
    caches: dict[WalkSettings, GRFWalkCache] = {}
    for module in model.modules():
        if isinstance(module, GRFCore) and module.share_walks:
            module.walk_cache = caches.setdefault(module.walk_cache.settings, module.walk_cache)
    return len(caches)


def _host_ptr(num_nodes: int, batch: Tensor | None, layout: RaggedLayout | None) -> Tensor | None:
    """The CPU graph offsets the walks are sampled on: the layout's, else read from ``batch``; None: one
    graph."""
    if layout is not None:
        return layout.ptr
    return graph_ptr(num_nodes, batch=batch) if batch is not None else None


class GRFCore(AttentionCore):
    r"""Linear attention masked by graph random features, from the `"Linear Transformer Topological
    Masking with Graph Random Features" <https://arxiv.org/abs/2410.03462>`_ paper (ICLR 2025).

    For head :math:`h` with queries :math:`\mathbf{q}_i`, keys :math:`\mathbf{k}_j` and values
    :math:`\mathbf{v}_j`,

    .. math::
        \mathbf{o}_i = \frac{\sum_j \widehat{M}_{ij}\, \phi(\mathbf{q}_i)^\top \phi(\mathbf{k}_j)\,
        \mathbf{v}_j}{\sum_j \widehat{M}_{ij}\, \phi(\mathbf{q}_i)^\top \phi(\mathbf{k}_j)},
        \qquad \widehat{M} = \widehat{\Phi}\widehat{\Phi}^\top + c\,\mathbf{1}\mathbf{1}^\top,
        \qquad \widehat{\Phi} = \sum_{t=0}^{T} f_t \mathbf{P}_t,

    where :math:`\mathbf{P}_t` holds the importance-weighted loads of ``num_walks`` halting random
    walks per node on the symmetric-normalised adjacency :math:`W`, so that
    :math:`\mathbb{E}[\widehat{M}] \approx \sum_k (f * f)_k W^k + c\,\mathbf{1}\mathbf{1}^\top`.
    :math:`f = \mathrm{softplus}(\theta) \geq 0` is learned per head; the walks are sampled once per
    graph and reused while the same ``edge_index`` comes back (a changed graph is resampled), in a
    :class:`GRFWalkCache` that the GRF cores of a model share (``share_walks``). The
    constant term :math:`c` (per graph) keeps a global path. Cost :math:`O(\mathrm{nnz}(\widehat{\Phi})
    \cdot m \cdot d)`, linear in N for bounded degree; all heads share one set of walks.

    With ``form="asymmetric"`` the mask is :math:`\widehat{M} = \widehat{\Phi}` itself (keys take
    :math:`f = \delta_0`), computed as a weighted edge list in :math:`O(\mathrm{nnz} \cdot d)`; this
    form also takes ``feature_map="softmax"`` (:math:`\exp(\mathbf{q}_i^\top\mathbf{k}_j/\sqrt{d})`).
    The sparse kernels have no half-precision version: give float32 tokens (under autocast,
    :class:`~kmipgt.nn.GRFAttention` runs in float32).

    Args:
        heads (int): Number of attention heads.
        head_dim (int): Size of each head.
        dropout (float, optional): Must be :obj:`0.`: the weights are never materialised. (default: :obj:`0.`)
        num_walks (int, optional): Walkers per node. (default: :obj:`4`)
        p_halt (float, optional): Halting probability per step. (default: :obj:`0.5`)
        max_len (int, optional): Walk truncation, the length of f minus one. (default: :obj:`8`)
        feature_map (str, optional): ``"relu"``, ``"elu"`` or ``"favor+"`` (or ``"softmax"`` with
            ``form="asymmetric"``). (default: :obj:`"relu"`)
        form (str, optional): ``"symmetric"`` (two sparse products, :math:`\widehat{\Phi}\widehat{\Phi}^\top`)
            or ``"asymmetric"`` (edge list, :math:`\widehat{\Phi}`). (default: :obj:`"symmetric"`)
        explicit_mask (bool, optional): For ``form="symmetric"``: compute through the explicit sparse
            :math:`\widehat{\Phi}\widehat{\Phi}^\top` (SDDMM + SpMM) instead of two sparse products
            of width :math:`m (d + 1)`. Same output; ``None`` picks the cheaper one from the walks'
            visit counts. (default: :obj:`None`)
        num_random_features (int, optional): FAVOR+ features per head; ``head_dim`` if not given.
        global_weight (float, optional): :math:`c \geq 0`. (default: :obj:`0.0`)
        f_decay (float, optional): f is initialised to :math:`e^{-\mathrm{decay} \cdot t}`; loads grow
            like :math:`(1 - p_{halt})^{-t}`, so a decaying start keeps the estimate's variance low.
            (default: :obj:`0.5`)
        antithetic (bool, optional): Antithetic termination for walker pairs. (default: :obj:`False`)
        repelling (bool, optional): Repelling (without-replacement) walks. (default: :obj:`False`)
        seed (int, optional): Seed of the walk sampler; new graphs take ``seed + k``.
        share_walks (bool, optional): Let :func:`share_walk_caches` (called by
            :class:`~kmipgt.nn.GraphTransformer`) give this core the walks of the model's other GRF cores
            with the same walk settings; ``False`` keeps walks of its own. (default: :obj:`True`)

    Shapes:
        - **input:** tokens :math:`(N, H, d)` each, edge indices :math:`(2, E)` (required), sorted batch
          vector :math:`(N)` (optional)
        - **output:** :math:`(N, H, d)`
    """

    # Added to the normaliser on every route, so that rows with zero mass give 0, not NaN.
    eps = 1e-6

    def __init__(
        self,
        heads: int,
        head_dim: int,
        dropout: float = 0.0,
        *,
        num_walks: int = 4,
        p_halt: float = 0.5,
        max_len: int = 8,
        feature_map: str = "relu",
        form: str = "symmetric",
        explicit_mask: bool | None = None,
        num_random_features: int | None = None,
        global_weight: float = 0.0,
        f_decay: float = 0.5,
        antithetic: bool = False,
        repelling: bool = False,
        seed: int | None = None,
        share_walks: bool = True,
    ) -> None:
        super().__init__(heads, head_dim, dropout)
        if dropout != 0.0:
            raise ValueError("attention kind 'grf' has no attention dropout; set its dropout to 0")
        if form not in ("symmetric", "asymmetric"):
            raise ValueError(f"`form` must be 'symmetric' or 'asymmetric', got {form!r}")
        allowed = FEATURE_MAPS if form == "symmetric" else (*FEATURE_MAPS, "softmax")
        if feature_map not in allowed:
            raise ValueError(f"`feature_map` must be one of {allowed} for form={form!r}, got {feature_map!r}")
        if global_weight < 0:
            raise ValueError(f"`global_weight` must be non-negative, got {global_weight}")
        if feature_map == "softmax" and global_weight > 0:
            raise ValueError(
                "`global_weight > 0` needs a linear feature map; with softmax it is full attention"
            )
        self.num_walks, self.p_halt, self.max_len = num_walks, p_halt, max_len
        self.feature_map, self.form, self.explicit_mask = feature_map, form, explicit_mask
        self.global_weight, self.f_decay = global_weight, f_decay
        self.antithetic, self.repelling, self.seed = antithetic, repelling, seed
        self.theta = torch.nn.Parameter(torch.empty(heads, max_len + 1))
        self.num_random_features = num_random_features or head_dim
        if feature_map == "favor+":
            self.register_buffer("projection", torch.empty(self.num_random_features, head_dim))
        else:
            self.projection = None
        self.share_walks = share_walks
        # A plain attribute, not a submodule: walks are neither parameters nor state to save, and several
        # cores may hold the same cache (share_walk_caches).
        self.walk_cache = GRFWalkCache(WalkSettings(num_walks, p_halt, max_len, antithetic, repelling, seed))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""Resets f, redraws the random features and forgets the cached walks (of all cores sharing them)."""
        with torch.no_grad():
            f = self.initial_f()
            # Inverse softplus, so that softplus(theta) starts at f.
            self.theta.copy_((f + torch.log(-torch.expm1(-f))).expand_as(self.theta))
        self.redraw_projection()
        self.walk_cache.clear()

    @torch.no_grad()
    def redraw_projection(self) -> None:
        r"""Draws new FAVOR+ random features; deterministic feature maps have none, so it does nothing."""
        if self.projection is None:
            return
        self.projection.copy_(
            orthogonal_random_features(self.num_random_features, self.head_dim, device=self.projection.device)
        )

    def initial_f(self) -> Tensor:
        r"""The modulation every head starts from, :math:`e^{-\mathrm{decay} \cdot t}`, ``[max_len + 1]``."""
        return torch.exp(-self.f_decay * torch.arange(self.max_len + 1, dtype=torch.float))

    @property
    def f(self) -> Tensor:
        r"""The modulation function :math:`f \geq 0`, shape ``[heads, max_len + 1]``."""
        return F.softplus(self.theta)

    def walks(self, edge_index: Tensor, num_nodes: int, ptr: Tensor | None = None) -> GRFWalks:
        r"""Walks for this graph (:meth:`GRFWalkCache.walks`): cached while ``edge_index`` is unchanged."""
        return self.walk_cache.walks(edge_index, num_nodes, ptr)

    def _mask_pattern(self, walks: GRFWalks) -> GRFMaskPattern | None:
        """The explicit mask's pattern when this core computes through it, else ``None``."""
        if self.form != "symmetric":
            return None
        use = self.explicit_mask
        if use is None:
            # Flops per head: the products Φ̂_iu Φ̂_ju (an upper bound on nnz(M̂)) times the edge-list
            # work, against two sparse products of width m (d + 1).
            width = self.num_random_features if self.feature_map == "favor+" else self.head_dim
            products = self.walk_cache.num_products()
            use = products * (width + self.head_dim + 2) < 2 * walks.nnz * width * (self.head_dim + 1)
        return self.walk_cache.mask_pattern() if use else None

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor | None = None,
        batch: Tensor | None = None, layout: RaggedLayout | None = None,
    ) -> Tensor:
        n = query.shape[0]
        ptr = _host_ptr(n, batch, layout)
        walks = self._graph_walks(edge_index, n, ptr)
        f = self.f.to(query.dtype)
        options = {
            "projection": self.projection, "global_weight": self.global_weight, "ptr": ptr, "eps": self.eps
        }
        pattern = self._mask_pattern(walks)
        if pattern is not None:
            # Values of Φ̂ only: the sparse Φ̂ would cache [3, H·P] int64 indices in the shared walks.
            values = grf_feature_values(walks, f)
            return pattern_masked_attention(
                query, key, value, values, pattern, feature_map=self.feature_map, **options
            )
        features = grf_features(walks, f)
        if self.form == "symmetric":
            feature_map = self.feature_map
            return masked_linear_attention(query, key, value, features, feature_map=feature_map, **options)
        return asymmetric_masked_attention(query, key, value, features, score=self.feature_map, **options)

    def _graph_walks(self, edge_index: Tensor | None, num_nodes: int, ptr: Tensor | None) -> GRFWalks:
        if edge_index is None:
            raise ValueError("GRF attention needs `edge_index`: the mask is built from walks on the graph")
        return self.walks(edge_index, num_nodes, ptr)

    def fused_block_mask(
        self, edge_index: Tensor | None, num_nodes: int, batch: Tensor | None = None,
        layout: RaggedLayout | None = None,
    ) -> tuple[CSRPattern, Tensor] | None:
        r"""The mask of every head as one block-diagonal ``[H·N, H·N]`` CSR pattern and its ``[H·M]`` values
        (:func:`kmipgt.grf.block_mask`) when this core computes through the explicit mask with ReLU features
        and no global term (the route ``explicit_mask=None`` picks on sparse graphs with few walkers): the
        route that :func:`~kmipgt.grf.edge_sums.normalised_kernel_attention_rows` can take a chunk of nodes
        at a time. ``None`` on every other route. The values are non-negative without a check (the other
        routes check): ``f = softplus(θ)`` and the walks' loads are."""
        if self.form != "symmetric" or self.feature_map not in FUSED_FEATURE_MAPS or self.global_weight > 0:
            return None
        walks = self._graph_walks(edge_index, num_nodes, _host_ptr(num_nodes, batch, layout))
        pattern = self._mask_pattern(walks)
        if pattern is None:
            return None
        return block_mask(grf_feature_values(walks, self.f), pattern, self.heads)

    def extra_repr(self) -> str:
        return (
            f"num_walks={self.num_walks}, p_halt={self.p_halt}, max_len={self.max_len}, "
            f"feature_map={self.feature_map!r}, form={self.form!r}, global_weight={self.global_weight}"
        )
