"""How well graph random features estimate the mask they stand for, against the exact dense mask.

GRF attention masks linear attention with ``M̂ = Φ̂Φ̂ᵀ``, where each row of ``Φ̂`` is a Monte-Carlo estimate,
from ``n`` random walks out of one node, of the same row of ``Φ = Σ_t f_t W^t`` (Reid et al., ICLR 2025).
Here ``Φ`` and ``M = ΦΦᵀ`` are computed exactly, as dense matrix powers built from ``edge_index`` alone
(none of the walk sampler's code), and the estimates are compared with them as ``n`` grows. Dense
``[N, N]`` matrices, one head at a time: for graphs of a few thousand nodes.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

import torch
from torch import Tensor

from kmipgt.grf import grf_features, sample_walks

__all__ = ["estimation_errors", "exact_modulated_walks", "summarize_errors"]


def _normalised_adjacency(edge_index: Tensor, num_nodes: int) -> Tensor:
    """Sparse float64 ``W`` ``[N, N]`` (COO): ``W[i, j] = 1 / √(out-degree(i) · in-degree(j))`` on each edge
    ``i → j`` (duplicates counted once); symmetric normalisation on undirected graphs."""
    row, col = edge_index.long().cpu()
    keys = torch.unique(row * num_nodes + col)
    row, col = keys // num_nodes, keys % num_nodes
    out_degree = torch.bincount(row, minlength=num_nodes).double()
    in_degree = torch.bincount(col, minlength=num_nodes).double()
    weight = (out_degree[row] * in_degree[col]).rsqrt()
    return torch.sparse_coo_tensor(
        torch.stack([row, col]), weight, (num_nodes, num_nodes), check_invariants=False
    ).coalesce()


def exact_modulated_walks(edge_index: Tensor, num_nodes: int, f: Tensor) -> Tensor:
    """The exact ``Φ = Σ_t f_t W^t`` that GRFs estimate, dense, in float64.

    Args:
        edge_index: ``[2, E]`` edges ``i → j`` (both directions for an undirected graph).
        num_nodes: N.
        f: ``[T + 1]`` one modulation function, or ``[H, T + 1]`` one per head.

    Returns:
        ``[N, N]`` for 1-D ``f``, ``[H, N, N]`` for 2-D ``f``; the mask is ``Φ Φᵀ``.
    """
    if f.dim() not in (1, 2):
        raise ValueError(f"`f` must have shape [T + 1] or [H, T + 1], got {tuple(f.shape)}")
    w = _normalised_adjacency(edge_index, num_nodes)
    coefficients = f.detach().double().cpu()
    if coefficients.dim() == 1:
        coefficients = coefficients[None]
    eye = torch.eye(num_nodes, dtype=torch.float64)
    heads = []
    for row in coefficients:
        # Horner: Φ = f_0 I + W (f_1 I + W (f_2 I + ...)); sparse W times dense, O(T · E · N).
        phi = row[-1] * eye
        for t in range(row.numel() - 2, -1, -1):
            phi = torch.sparse.mm(w, phi) + row[t] * eye
        heads.append(phi)
    return heads[0] if f.dim() == 1 else torch.stack(heads)


def _relative_error(estimate: Tensor, exact: Tensor) -> float:
    """The relative Frobenius error ``‖estimate − exact‖ / ‖exact‖`` of two ``[N, N]`` matrices."""
    return float(torch.linalg.matrix_norm(estimate - exact) / torch.linalg.matrix_norm(exact))


def estimation_errors(
    edge_index: Tensor,
    num_nodes: int,
    f: Tensor,
    num_walks: Sequence[int],
    seeds: Sequence[int],
    *,
    p_halt: float,
    repelling: bool = False,
    antithetic: bool = False,
) -> list[dict]:
    """Relative errors of the GRF estimates of ``Φ`` and of the mask ``M = ΦΦᵀ``, per walk count and seed.

    For each ``n`` in ``num_walks`` and each seed, walks are sampled as GRF attention samples them
    (:func:`kmipgt.grf.sample_walks` with ``max_len = T``), turned into ``Φ̂`` by
    :func:`kmipgt.grf.grf_features`, and compared with :func:`exact_modulated_walks`.

    Args:
        edge_index, num_nodes: the graph.
        f: ``[H, T + 1]`` modulation functions (e.g. every head of every layer of a trained model).
        num_walks: walkers per node to try.
        seeds: walk seeds per walk count.
        p_halt, repelling, antithetic: the walk settings of :func:`kmipgt.grf.sample_walks`.

    Returns:
        One row per walk count, seed and row ``h`` of ``f``: ``num_walks``, ``seed``, ``head``,
        ``features_error`` (``‖Φ̂ − Φ‖_F / ‖Φ‖_F``), ``mask_error`` (``‖Φ̂Φ̂ᵀ − ΦΦᵀ‖_F / ‖ΦΦᵀ‖_F``, diagonal
        included, as attention uses it), ``nonzeros_per_row`` of ``Φ̂``, and the mean number of keys that a
        query's masked attention reaches: ``mask_nonzeros_per_row`` of ``Φ̂Φ̂ᵀ`` and
        ``exact_mask_nonzeros_per_row`` of ``ΦΦᵀ``.
    """
    if f.dim() != 2:
        raise ValueError(f"`f` must have shape [H, T + 1], got {tuple(f.shape)}")
    coefficients = f.detach().double().cpu()
    # One head at a time: [N, N] float64 each, so that a graph of a few thousand nodes fits.
    exact = []
    for head_f in coefficients:
        phi = exact_modulated_walks(edge_index, num_nodes, head_f)
        exact.append((phi, phi @ phi.T))
    rows = []
    for walks_per_node in num_walks:
        for seed in seeds:
            walks = sample_walks(
                edge_index.cpu(), num_nodes, num_walks=walks_per_node, p_halt=p_halt,
                max_len=coefficients.shape[1] - 1, seed=seed, repelling=repelling, antithetic=antithetic,
                dtype=torch.float64,
            )
            for head, (phi, mask) in enumerate(exact):
                estimate = grf_features(walks, coefficients[head]).to_dense()
                # Dense: at N = 2,642 one BLAS product takes 2 s, torch's COO product 15 to 25 s.
                estimated_mask = estimate @ estimate.T
                rows.append({
                    "num_walks": walks_per_node, "seed": seed, "head": head,
                    "features_error": _relative_error(estimate, phi),
                    "mask_error": _relative_error(estimated_mask, mask),
                    "nonzeros_per_row": walks.nnz / num_nodes,
                    "mask_nonzeros_per_row": int(torch.count_nonzero(estimated_mask)) / num_nodes,
                    "exact_mask_nonzeros_per_row": int(torch.count_nonzero(mask)) / num_nodes,
                })
    return rows


def summarize_errors(rows: list[dict]) -> list[dict]:
    """Per walk count of :func:`estimation_errors` rows: mean and sample std (over seeds and heads) of both
    errors, and the mean nonzeros per row of ``Φ̂``, of the estimated mask and of the exact one."""
    summary = []
    for walks_per_node in dict.fromkeys(row["num_walks"] for row in rows):
        group = [row for row in rows if row["num_walks"] == walks_per_node]
        entry = {"num_walks": walks_per_node, "rows": len(group)}
        for key in ("features_error", "mask_error"):
            values = [row[key] for row in group]
            entry[key] = statistics.fmean(values)
            entry[f"{key}_std"] = statistics.stdev(values) if len(values) > 1 else float("nan")
        for key in ("nonzeros_per_row", "mask_nonzeros_per_row", "exact_mask_nonzeros_per_row"):
            entry[key] = statistics.fmean(row[key] for row in group)
        summary.append(entry)
    return summary
