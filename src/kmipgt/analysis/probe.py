"""Linear probe of where a node label's signal lies: in hop neighbourhoods or in spatial neighbourhoods.

A logistic regression is fitted on the training nodes to features averaged over growing neighbourhoods
and scored on the test nodes. If averages over the k spatially nearest nodes predict the label better
than averages over h hops, the label needs information an h-layer MPNN cannot reach but a position-keyed
global attention could; if they add nothing over the coordinates themselves, a model that already sees
the coordinates has the regional signal without attention.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.spatial import cKDTree
from sklearn.linear_model import LogisticRegression
from torch import Tensor

from kmipgt.analysis.hops import undirected_adjacency


def hop_means(x: Tensor, edge_index: Tensor, hops: int) -> list[Tensor]:
    r"""Features after 0..``hops`` random-walk steps on the undirected graph with self-loops.

    :math:`\mathbf{X}^{(h)} = (\mathbf{D}^{-1}(\mathbf{A} + \mathbf{I}))^h \mathbf{X}`: each row is a
    walk-weighted mean over the node's h-hop ball. ``x [N, F]``, ``edge_index [2, E]`` -> ``hops + 1``
    tensors ``[N, F]``.
    """
    n = x.size(0)
    adjacency = (undirected_adjacency(edge_index, n) > 0).astype(np.float64) + sp.eye(n)
    walk = sp.diags(1.0 / np.asarray(adjacency.sum(1)).ravel()) @ adjacency
    out, h = [x], x.double().numpy()
    for _ in range(hops):
        h = walk @ h
        out.append(torch.from_numpy(h).to(x.dtype))
    return out


def spatial_means(x: Tensor, coords: Tensor, k: int) -> Tensor:
    """Mean of ``x [N, F]`` over each node's ``k`` nearest nodes by ``coords [N, c]`` (itself included)."""
    k = min(k, x.size(0))
    _, index = cKDTree(coords.double().numpy()).query(coords.double().numpy(), k=k)
    return x[torch.from_numpy(np.asarray(index).reshape(x.size(0), k))].mean(1)


def _probe_accuracy(features: Tensor, y: Tensor, train: Tensor, test: Tensor, seed: int) -> float:
    f = features.double().numpy()
    f = (f - f.mean(0)) / (f.std(0) + 1e-12)
    model = LogisticRegression(max_iter=2000, random_state=seed).fit(f[train.numpy()], y[train].numpy())
    return float(model.score(f[test.numpy()], y[test].numpy()))


def neighbourhood_probe(
    x: Tensor,
    y: Tensor,
    edge_index: Tensor,
    train_mask: Tensor,
    test_mask: Tensor,
    coords: Tensor | None = None,
    hops: tuple[int, ...] = (0, 2, 4, 8, 16),
    spatial_k: tuple[int, ...] = (16, 64, 256, 1024),
    seed: int = 0,
) -> dict[str, float]:
    """Test accuracy of a logistic regression on neighbourhood-averaged node features.

    Rows: ``"hops<=h"`` (raw features and their 2-, 4-, ... h-step walk means, concatenated),
    ``"spatial k"`` (raw features and their mean over the k nearest nodes by ``coords``) and
    ``"hops<=H + spatial k"`` (both, H the largest hop count up to 8, what an 8-layer MPNN could see).

    Args:
        x: node features ``[N, F]``.
        y: class labels ``[N]``.
        edge_index: ``[2, E]`` (direction is ignored).
        train_mask, test_mask: boolean ``[N]``.
        coords: node positions ``[N, c]`` (spatial rows are skipped without them).
        hops: hop counts to report (0 = raw features).
        spatial_k: neighbourhood sizes of the spatial rows.
        seed: the regression's random state.
    """
    if x.dim() != 2 or y.shape != (x.size(0),):
        raise ValueError(f"x must be [N, F] and y [N], got {list(x.shape)} and {list(y.shape)}")
    walks = hop_means(x, edge_index, max(hops, default=0))
    rows: dict[str, float] = {}
    for h in sorted(hops):
        kept = [walks[0], *(walks[i] for i in sorted(hops) if 0 < i <= h)]
        rows[f"hops<={h}"] = _probe_accuracy(torch.cat(kept, 1), y, train_mask, test_mask, seed)
    if coords is None:
        return rows
    near = [walks[0], *(walks[i] for i in sorted(hops) if 0 < i <= 8)]
    for k in spatial_k:
        regional = spatial_means(x, coords, k)
        rows[f"spatial {k}"] = _probe_accuracy(torch.cat([x, regional], 1), y, train_mask, test_mask, seed)
        both = torch.cat([*near, regional], 1)
        rows[f"hops<={min(8, max(hops))} + spatial {k}"] = _probe_accuracy(
            both, y, train_mask, test_mask, seed
        )
    return rows
