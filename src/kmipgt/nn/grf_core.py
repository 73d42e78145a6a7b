"""The GRF attention core: linear attention masked by graph random features, in O(N) (kind ``grf``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kmipgt.grf import (
    FEATURE_MAPS,
    GRFMaskPattern,
    GRFWalks,
    asymmetric_masked_attention,
    grf_features,
    grf_mask_pattern,
    masked_linear_attention,
    orthogonal_random_features,
    sample_walks,
)
from kmipgt.nn.cores import AttentionCore
from kmipgt.ops.ragged import graph_ptr

__all__ = ["GRFCore"]


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
    graph and reused while the same ``edge_index`` comes back (a changed graph is resampled). The
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

    Shapes:
        - **input:** tokens :math:`(N, H, d)` each, edge indices :math:`(2, E)` (required), sorted batch
          vector :math:`(N)` (optional)
        - **output:** :math:`(N, H, d)`
    """

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
    ) -> None:
        super().__init__(heads, head_dim, dropout)
        if dropout != 0.0:
            raise ValueError("attention kind 'grf' has no attention dropout; set attn_dropout to 0")
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
        self._cached_edge_index: Tensor | None = None
        self._cached_walks: GRFWalks | None = None
        self._cached_pattern: GRFMaskPattern | None = None
        self._graphs_sampled = 0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""Resets f, redraws the random features and forgets cached walks."""
        with torch.no_grad():
            f = torch.exp(-self.f_decay * torch.arange(self.max_len + 1, dtype=torch.float))
            # Inverse softplus, so that softplus(theta) starts at f.
            self.theta.copy_((f + torch.log(-torch.expm1(-f))).expand_as(self.theta))
        self.redraw_projection()
        self._cached_edge_index, self._cached_walks, self._cached_pattern = None, None, None

    @torch.no_grad()
    def redraw_projection(self) -> None:
        r"""Draws new FAVOR+ random features; deterministic feature maps have none, so it does nothing."""
        if self.projection is None:
            return
        self.projection.copy_(
            orthogonal_random_features(self.num_random_features, self.head_dim, device=self.projection.device)
        )

    @property
    def f(self) -> Tensor:
        r"""The modulation function :math:`f \geq 0`, shape ``[heads, max_len + 1]``."""
        return F.softplus(self.theta)

    def walks(self, edge_index: Tensor, num_nodes: int, ptr: Tensor | None = None) -> GRFWalks:
        r"""Walks for this graph: cached while ``edge_index`` is unchanged, sampled anew otherwise."""
        cached = self._cached_edge_index
        if (
            self._cached_walks is not None
            and self._cached_walks.num_nodes == num_nodes
            and cached is not None
            and cached.shape == edge_index.shape
            and cached.device == edge_index.device
            and torch.equal(cached, edge_index)
        ):
            return self._cached_walks
        seed = None if self.seed is None else self.seed + self._graphs_sampled
        walks = sample_walks(
            edge_index,
            num_nodes,
            num_walks=self.num_walks,
            p_halt=self.p_halt,
            max_len=self.max_len,
            seed=seed,
            ptr=ptr,
            antithetic=self.antithetic,
            repelling=self.repelling,
        )
        self._graphs_sampled += 1
        self._cached_edge_index, self._cached_walks = edge_index.detach().clone(), walks
        self._cached_pattern = grf_mask_pattern(walks) if self._use_explicit_mask(walks) else None
        return walks

    def _use_explicit_mask(self, walks: GRFWalks) -> bool:
        if self.form != "symmetric":
            return False
        if self.explicit_mask is not None:
            return self.explicit_mask
        # Flops per head: the products Φ̂_iu Φ̂_ju (an upper bound on nnz(M̂)) times the edge-list work,
        # against two sparse products of width m (d + 1).
        visits = torch.bincount(walks.pairs[1], minlength=walks.num_nodes)
        products = int((visits * visits).sum())
        width = self.num_random_features if self.feature_map == "favor+" else self.head_dim
        return products * (width + self.head_dim + 2) < 2 * walks.nnz * width * (self.head_dim + 1)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, edge_index: Tensor | None = None,
        batch: Tensor | None = None,
    ) -> Tensor:
        if edge_index is None:
            raise ValueError("GRF attention needs `edge_index`: the mask is built from walks on the graph")
        n = query.shape[0]
        ptr = graph_ptr(n, batch=batch) if batch is not None else None
        features = grf_features(self.walks(edge_index, n, ptr), self.f.to(query.dtype))
        options = {"projection": self.projection, "global_weight": self.global_weight, "ptr": ptr}
        if self.form == "symmetric":
            return masked_linear_attention(
                query, key, value, features, feature_map=self.feature_map, mask_pattern=self._cached_pattern,
                **options,
            )
        return asymmetric_masked_attention(query, key, value, features, score=self.feature_map, **options)

    def extra_repr(self) -> str:
        return (
            f"num_walks={self.num_walks}, p_halt={self.p_halt}, max_len={self.max_len}, "
            f"feature_map={self.feature_map!r}, form={self.form!r}, global_weight={self.global_weight}"
        )
