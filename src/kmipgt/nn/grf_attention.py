"""Global attention with a learnable GRF topological mask, in O(N) (the ``grf`` attention kind)."""

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
from kmipgt.ops.ragged import graph_ptr

__all__ = ["GRFAttention"]


class GRFAttention(torch.nn.Module):
    r"""Linear attention masked by graph random features, from the `"Linear Transformer Topological
    Masking with Graph Random Features" <https://arxiv.org/abs/2410.03462>`_ paper (ICLR 2025).

    For head :math:`h` with queries :math:`\mathbf{q}_i`, keys :math:`\mathbf{k}_j` and values
    :math:`\mathbf{v}_j` (linear projections of :math:`\mathbf{x}`),

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

    Args:
        channels (int): Size of each input and output node feature.
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        head_channels (int, optional): Size of each head; ``channels // heads`` if not given.
        num_walks (int, optional): Walkers per node. (default: :obj:`4`)
        p_halt (float, optional): Halting probability per step. (default: :obj:`0.5`)
        max_len (int, optional): Walk truncation, the length of f minus one. (default: :obj:`8`)
        feature_map (str, optional): ``"relu"``, ``"elu"`` or ``"favor+"`` (or ``"softmax"`` with
            ``form="asymmetric"``). (default: :obj:`"relu"`)
        explicit_mask (bool, optional): For ``form="symmetric"``: compute through the explicit sparse
            :math:`\widehat{\Phi}\widehat{\Phi}^\top` (SDDMM + SpMM) instead of two sparse products
            of width :math:`m (d + 1)`. Same output; ``None`` picks the cheaper one from the walks'
            visit counts. (default: :obj:`None`)
        form (str, optional): ``"symmetric"`` (two sparse products, :math:`\widehat{\Phi}\widehat{\Phi}^\top`)
            or ``"asymmetric"`` (edge list, :math:`\widehat{\Phi}`). (default: :obj:`"symmetric"`)
        num_random_features (int, optional): FAVOR+ features per head; ``head_channels`` if not given.
        global_weight (float, optional): :math:`c \geq 0`. (default: :obj:`0.0`)
        f_decay (float, optional): f is initialised to :math:`e^{-\mathrm{decay} \cdot t}`; loads grow
            like :math:`(1 - p_{halt})^{-t}`, so a decaying start keeps the estimate's variance low.
            (default: :obj:`0.5`)
        antithetic (bool, optional): Antithetic termination for walker pairs. (default: :obj:`False`)
        repelling (bool, optional): Repelling (without-replacement) walks. (default: :obj:`False`)
        seed (int, optional): Seed of the walk sampler; new graphs take ``seed + k``.
        qkv_bias (bool, optional): Bias in the query, key and value projections. (default: :obj:`True`)

    Shapes:
        - **input:** node features :math:`(N, F)`, sorted batch vector :math:`(N)` (optional),
          edge indices :math:`(2, E)` (required)
        - **output:** node features :math:`(N, F)`
    """

    def __init__(
        self,
        channels: int,
        heads: int = 1,
        head_channels: int | None = None,
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
        qkv_bias: bool = True,
    ) -> None:
        super().__init__()
        if head_channels is None:
            if channels % heads:
                raise ValueError(f"`channels` ({channels}) must be divisible by `heads` ({heads})")
            head_channels = channels // heads
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
        self.channels, self.heads, self.head_channels = channels, heads, head_channels
        self.num_walks, self.p_halt, self.max_len = num_walks, p_halt, max_len
        self.feature_map, self.form, self.explicit_mask = feature_map, form, explicit_mask
        self.global_weight, self.f_decay = global_weight, f_decay
        self.antithetic, self.repelling, self.seed = antithetic, repelling, seed
        inner = heads * head_channels
        self.q = torch.nn.Linear(channels, inner, bias=qkv_bias)
        self.k = torch.nn.Linear(channels, inner, bias=qkv_bias)
        self.v = torch.nn.Linear(channels, inner, bias=qkv_bias)
        self.out = torch.nn.Linear(inner, channels)
        self.theta = torch.nn.Parameter(torch.empty(heads, max_len + 1))
        self.num_random_features = num_random_features or head_channels
        if feature_map == "favor+":
            self.register_buffer("projection", torch.empty(self.num_random_features, head_channels))
        else:
            self.projection = None
        self._cached_edge_index: Tensor | None = None
        self._cached_walks: GRFWalks | None = None
        self._cached_pattern: GRFMaskPattern | None = None
        self._graphs_sampled = 0
        self.reset_parameters()

    def reset_parameters(self) -> None:
        r"""Resets all learnable parameters of the module and forgets cached walks."""
        for linear in (self.q, self.k, self.v, self.out):
            linear.reset_parameters()
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
            orthogonal_random_features(
                self.num_random_features, self.head_channels, device=self.projection.device
            )
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
        width = self.num_random_features if self.feature_map == "favor+" else self.head_channels
        return products * (width + self.head_channels + 2) < 2 * walks.nnz * width * (self.head_channels + 1)

    def forward(self, x: Tensor, batch: Tensor | None = None, edge_index: Tensor | None = None) -> Tensor:
        r"""Runs the forward pass.

        Args:
            x (torch.Tensor): Node features ``[N, channels]``.
            batch (torch.Tensor, optional): Sorted graph id per node ``[N]`` (PyG ``Batch.batch``).
            edge_index (torch.Tensor): Edges ``[2, E]``; the mask is built from them.
        """
        if edge_index is None:
            raise ValueError("GRFAttention needs `edge_index`: the mask is built from walks on the graph")
        if x.dim() != 2 or x.shape[1] != self.channels:
            raise ValueError(f"`x` must have shape [N, {self.channels}], got {tuple(x.shape)}")
        # The sparse mask kernels (sparse_sampled_addmm) have no bfloat16/half version: under autocast
        # this module runs in fp32.
        with torch.autocast(x.device.type, enabled=False):
            return self._forward(x.float(), batch, edge_index)

    def _forward(self, x: Tensor, batch: Tensor | None, edge_index: Tensor) -> Tensor:
        n = x.shape[0]
        ptr = graph_ptr(n, batch=batch) if batch is not None else None
        features = grf_features(self.walks(edge_index, n, ptr), self.f.to(x.dtype))
        shape = (n, self.heads, self.head_channels)
        q, k, v = self.q(x).view(shape), self.k(x).view(shape), self.v(x).view(shape)
        if self.form == "symmetric":
            out = masked_linear_attention(
                q,
                k,
                v,
                features,
                feature_map=self.feature_map,
                projection=self.projection,
                global_weight=self.global_weight,
                ptr=ptr,
                mask_pattern=self._cached_pattern,
            )
        else:
            out = asymmetric_masked_attention(
                q,
                k,
                v,
                features,
                score=self.feature_map,
                projection=self.projection,
                global_weight=self.global_weight,
                ptr=ptr,
            )
        return self.out(out.reshape(n, -1))

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}({self.channels}, heads={self.heads}, "
            f"head_channels={self.head_channels}, num_walks={self.num_walks}, p_halt={self.p_halt}, "
            f"max_len={self.max_len}, feature_map={self.feature_map!r}, form={self.form!r}, "
            f"global_weight={self.global_weight})"
        )
