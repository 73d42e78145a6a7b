"""Halting random walks with importance-weighted loads: the Monte-Carlo part of graph random features.

For every node ``i`` we run ``n`` walkers. A walker at step ``t`` sits on node ``u`` carrying a *load*
(product of traversed edge weights over the probability of its prefix). At each step it halts with
probability ``p_halt``, otherwise it moves to a uniformly chosen neighbour ``u'`` and its load is
multiplied by ``W[u, u'] · deg(u) / (1 - p_halt)``. The per-step matrices

    P_t[i, u] = (1 / n) · Σ_{walkers of i at node u at step t} load

give the unbiased estimate ``E[Σ_t f_t P_t] = Σ_t f_t W^t`` (Reid et al., ICLR 2025, Sec. 3.3).
All walkers advance together as one tensor; the only Python loop is over the ``max_len`` steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from kmipgt.grf.sparse import index_dtype

__all__ = ["GRFWalks", "sample_walks"]


@dataclass(frozen=True)
class GRFWalks:
    """Per-step loads of sampled walks, stored once as a COO list with a step index.

    ``E`` records (one per distinct ``(step, start, node)``) and ``P`` distinct ``(start, node)`` pairs.
    Indices are int32 where they fit (node ids below 2^31, ``E`` below 2^31): they live as long as the
    graph does, and int64 doubled them. Sparse tensors built from them take int64 copies.

    Attributes:
        num_nodes: N.
        num_walks: n, walkers per node.
        max_len: truncation length; steps run from 0 to ``max_len``.
        step: ``[E]`` int32 walk step t.
        start: ``[E]`` int32 (int64 for N ≥ 2^31) start node i.
        node: ``[E]`` int32 (int64 for N ≥ 2^31) visited node u.
        load: ``[E]`` float ``P_t[i, u]``, the summed loads divided by n.
        pairs: ``[2, P]`` int32 (int64 for N ≥ 2^31) distinct ``(start, node)`` pairs, sorted row-major
            (coalesced order).
        pair_index: ``[E]`` int32 (int64 for E ≥ 2^31) column of ``pairs`` that each record belongs to.
    """

    num_nodes: int
    num_walks: int
    max_len: int
    step: Tensor
    start: Tensor
    node: Tensor
    load: Tensor
    pairs: Tensor
    pair_index: Tensor

    _head_indices: dict = field(default_factory=dict, compare=False, repr=False)

    def head_indices(self, heads: int) -> Tensor:
        """``[3, H·P]`` int64 ``(head, start, node)`` indices of ``H`` stacked copies of ``pairs``.

        Cached per H: the pattern is the same on every forward, and rebuilding it allocated 100 MB of
        int64 per call at N = 2^18 with 4 heads.
        """
        if heads not in self._head_indices:
            head = torch.arange(heads, device=self.pairs.device).repeat_interleave(self.nnz)
            self._head_indices[heads] = torch.cat([head[None], self.pairs.long().repeat(1, heads)])
        return self._head_indices[heads]

    @property
    def nnz(self) -> int:
        """Number of nonzeros of the feature matrix ``Φ̂`` (distinct start/node pairs)."""
        return int(self.pairs.shape[1])

    def step_matrix(self, t: int) -> Tensor:
        """The sparse ``[N, N]`` matrix ``P_t`` of step ``t`` (coalesced COO)."""
        if not 0 <= t <= self.max_len:
            raise ValueError(f"`t` must lie in [0, {self.max_len}], got {t}")
        mask = self.step == t
        indices = torch.stack([self.start[mask], self.node[mask]]).long()
        size = (self.num_nodes, self.num_nodes)
        return torch.sparse_coo_tensor(indices, self.load[mask], size, check_invariants=False).coalesce()

    def to(self, device: torch.device | str) -> GRFWalks:
        """A copy with every tensor on ``device``."""
        moved = {name: getattr(self, name).to(device) for name in _TENSOR_FIELDS}
        return GRFWalks(self.num_nodes, self.num_walks, self.max_len, **moved)


_TENSOR_FIELDS = ("step", "start", "node", "load", "pairs", "pair_index")


def _check_arguments(
    edge_index: Tensor, num_nodes: int, num_walks: int, p_halt: float, max_len: int, antithetic: bool
) -> None:
    if not isinstance(edge_index, Tensor):
        raise TypeError(f"`edge_index` must be a torch.Tensor, got {type(edge_index).__name__}")
    if edge_index.dim() != 2 or edge_index.shape[0] != 2:
        raise ValueError(f"`edge_index` must have shape [2, E], got {tuple(edge_index.shape)}")
    if edge_index.dtype.is_floating_point or edge_index.dtype == torch.bool:
        raise TypeError(f"`edge_index` must hold integers, got dtype {edge_index.dtype}")
    if not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"`num_nodes` must be a positive int, got {num_nodes!r}")
    if edge_index.numel() and (int(edge_index.min()) < 0 or int(edge_index.max()) >= num_nodes):
        raise ValueError(f"`edge_index` must hold node ids in [0, {num_nodes})")
    if not isinstance(num_walks, int) or num_walks < 1:
        raise ValueError(f"`num_walks` must be a positive int, got {num_walks!r}")
    if not 0.0 < float(p_halt) < 1.0:
        raise ValueError(f"`p_halt` must lie in (0, 1), got {p_halt!r}")
    if not isinstance(max_len, int) or max_len < 0:
        raise ValueError(f"`max_len` must be a non-negative int, got {max_len!r}")
    if antithetic and num_walks % 2:
        raise ValueError(f"`antithetic=True` pairs walkers, so `num_walks` must be even, got {num_walks}")


def _check_within_graphs(edge_index: Tensor, num_nodes: int, ptr: Tensor) -> None:
    ptr = ptr.to(edge_index.device).long()
    if ptr.dim() != 1 or ptr.numel() < 2 or int(ptr[0]) != 0 or int(ptr[-1]) != num_nodes:
        raise ValueError(f"`ptr` must be [G + 1] offsets from 0 to num_nodes={num_nodes}")
    if bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError("`ptr` must be non-decreasing")
    graph = torch.bucketize(edge_index.contiguous(), ptr[1:], right=True)
    if bool((graph[0] != graph[1]).any()):
        raise ValueError(
            "`edge_index` connects nodes of different graphs in `ptr`; walks must stay in a graph"
        )


def _csr_adjacency(
    edge_index: Tensor, num_nodes: int, edge_weight: Tensor | None, dtype: torch.dtype
) -> tuple[Tensor, Tensor, Tensor]:
    """``(rowptr [N+1], col [E'], weight [E'])`` with duplicate edges merged (weights summed)."""
    row, col = edge_index.long()
    if edge_weight is None:
        edge_weight = torch.ones(row.numel(), dtype=dtype, device=row.device)
        symmetric_normalise = True
    else:
        if edge_weight.shape != (row.numel(),):
            raise ValueError(f"`edge_weight` must have shape [{row.numel()}], got {tuple(edge_weight.shape)}")
        if bool((edge_weight < 0).any()):
            raise ValueError("`edge_weight` must be non-negative (loads are importance weights)")
        edge_weight = edge_weight.to(dtype)
        symmetric_normalise = False
    keys, inverse = torch.unique(row * num_nodes + col, return_inverse=True)
    if symmetric_normalise:
        weight = torch.ones(keys.numel(), dtype=dtype, device=row.device)
    else:
        weight = torch.zeros(keys.numel(), dtype=dtype, device=row.device).index_add_(0, inverse, edge_weight)
    row, col = keys // num_nodes, keys % num_nodes
    deg = torch.bincount(row, minlength=num_nodes)
    if symmetric_normalise:
        # The target's in-degree, not its out-degree: they agree on undirected graphs, and on a directed
        # edge into a node without out-edges the out-degree is 0 and the weight would be infinite.
        in_deg = torch.bincount(col, minlength=num_nodes)
        weight = (deg[row] * in_deg[col]).to(dtype).rsqrt()
    rowptr = torch.cat([deg.new_zeros(1), deg.cumsum(0)])
    return rowptr, col, weight


def _termination_uniforms(
    walker: Tensor, num_walkers: int, antithetic: bool, generator: torch.Generator
) -> Tensor:
    """One U[0, 1) per live walker; antithetic pairs (2k, 2k+1) share ``u`` and ``(u + 1/2) mod 1``."""
    device = walker.device
    if not antithetic:
        return torch.rand(walker.numel(), generator=generator, device=device)
    base = torch.rand(num_walkers // 2, generator=generator, device=device)
    paired = torch.stack([base, torch.remainder(base + 0.5, 1.0)], dim=1).flatten()
    return paired[walker]


def _neighbour_uniforms(
    start: Tensor, pos: Tensor, num_nodes: int, repelling: bool, generator: torch.Generator
) -> Tensor:
    """One U[0, 1) per live walker choosing its next neighbour.

    Repelling: walkers of the same start node that share a node take a common random rotation
    ``u0`` and spread evenly, ``x_r = (u0 + r / g) mod 1`` for rank r among g walkers. Each ``x_r``
    is still uniform (the estimator stays unbiased) but neighbours are chosen without replacement.
    """
    device = pos.device
    if not repelling:
        return torch.rand(pos.numel(), generator=generator, device=device)
    group_key = start * num_nodes + pos
    sorted_key, order = torch.sort(group_key, stable=True)
    _, inverse, counts = torch.unique_consecutive(sorted_key, return_inverse=True, return_counts=True)
    first = counts.cumsum(0) - counts
    rank = torch.arange(pos.numel(), device=device) - first[inverse]
    rotation = torch.rand(counts.numel(), generator=generator, device=device)[inverse]
    spread = torch.remainder(rotation + rank / counts[inverse], 1.0)
    return torch.empty_like(spread).scatter_(0, order, spread)


def _aggregate(start: Tensor, node: Tensor, load: Tensor, num_nodes: int) -> tuple[Tensor, Tensor, Tensor]:
    keys, inverse = torch.unique(start * num_nodes + node, return_inverse=True)
    summed = torch.zeros(keys.numel(), dtype=load.dtype, device=load.device).index_add_(0, inverse, load)
    return keys // num_nodes, keys % num_nodes, summed


def sample_walks(
    edge_index: Tensor,
    num_nodes: int,
    *,
    num_walks: int,
    p_halt: float,
    max_len: int,
    seed: int | None = None,
    ptr: Tensor | None = None,
    edge_weight: Tensor | None = None,
    antithetic: bool = False,
    repelling: bool = False,
    dtype: torch.dtype = torch.float32,
) -> GRFWalks:
    """Sample ``num_walks`` halting random walks from every node and record their per-step loads.

    Args:
        edge_index: ``[2, E]`` edges (row = source). Pass both directions for an undirected graph; the
            mask ``Φ̂Φ̂ᵀ`` estimates ``Σ α_k W^k`` only for symmetric ``W``. Duplicate edges are merged.
        num_nodes: N.
        num_walks: n, walkers per node.
        p_halt: halting probability per step, in (0, 1).
        max_len: walks are truncated after this many moves.
        seed: seeds a private ``torch.Generator``; ``None`` draws a fresh seed.
        ptr: ``[G + 1]`` graph offsets of a block-diagonal batch; checked so that no edge (hence no
            walk) crosses graphs.
        edge_weight: ``[E]`` non-negative ``W``; default symmetric normalisation ``1/√(d_i d_j)`` (for a
            directed edge i → j: i's out-degree and j's in-degree).
        antithetic: pair walkers with antithetic termination (needs even ``num_walks``).
        repelling: walkers of one start node sharing a node pick neighbours without replacement.
        dtype: floating dtype of the loads.

    Returns:
        :class:`GRFWalks` with ``P_0 = I`` and the loads of steps 1..max_len. Walkers also stop at
        nodes without neighbours.
    """
    _check_arguments(edge_index, num_nodes, num_walks, p_halt, max_len, antithetic)
    if ptr is not None:
        _check_within_graphs(edge_index, num_nodes, ptr)
    device = edge_index.device
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    rowptr, col, weight = _csr_adjacency(edge_index, num_nodes, edge_weight, dtype)
    deg = rowptr.diff()
    continue_factor = 1.0 / (1.0 - float(p_halt))

    nodes = torch.arange(num_nodes, device=device)
    steps = [torch.zeros(num_nodes, dtype=torch.long, device=device)]
    starts, visited = [nodes], [nodes]
    loads = [torch.ones(num_nodes, dtype=dtype, device=device)]

    num_walkers = num_nodes * num_walks
    walker = torch.arange(num_walkers, device=device)
    pos = walker // num_walks
    load = torch.ones(num_walkers, dtype=dtype, device=device)
    for t in range(1, max_len + 1):
        survive = _termination_uniforms(walker, num_walkers, antithetic, generator) >= p_halt
        keep = survive & (deg[pos] > 0)
        walker, pos, load = walker[keep], pos[keep], load[keep]
        if walker.numel() == 0:
            break
        start = walker // num_walks
        degree = deg[pos]
        choice = _neighbour_uniforms(start, pos, num_nodes, repelling, generator)
        offset = torch.minimum((choice * degree).long(), degree - 1)
        edge = rowptr[pos] + offset
        load = load * weight[edge] * degree.to(dtype) * continue_factor
        pos = col[edge]
        start_t, node_t, load_t = _aggregate(start, pos, load / num_walks, num_nodes)
        steps.append(torch.full_like(start_t, t))
        starts.append(start_t)
        visited.append(node_t)
        loads.append(load_t)

    step, start, node, load = torch.cat(steps), torch.cat(starts), torch.cat(visited), torch.cat(loads)
    pair_keys, pair_index = torch.unique(start * num_nodes + node, return_inverse=True)
    pairs = torch.stack([pair_keys // num_nodes, pair_keys % num_nodes])
    # Sampled in int64 (the keys above reach N²), kept compact: the walks live as long as the graph.
    node_dtype = index_dtype(num_nodes - 1)
    return GRFWalks(
        num_nodes, num_walks, max_len, step.int(), start.to(node_dtype), node.to(node_dtype), load,
        pairs.to(node_dtype), pair_index.to(index_dtype(step.numel())),
    )
