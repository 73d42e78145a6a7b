"""Linear probe of where a node label's signal lies: in hop neighbourhoods or in spatial neighbourhoods.

A logistic regression is fitted on the training nodes to features averaged over growing neighbourhoods
and scored on the test nodes. If averages over the k spatially nearest nodes predict the label better
than averages over h hops, the label needs information an h-layer MPNN cannot reach but a position-keyed
global attention could; if they add nothing over the coordinates themselves, a model that already sees
the coordinates has the regional signal without attention. A second kind of row asks what the training
labels around a node say about it: the vote of the k spatially nearest training nodes, which is what a
model shown those labels as inputs (``task.label_inputs``) could copy. A third statistic needs no
features and no model: how often two nodes a given number of hops apart share a label. Where that is
little above what the label mix alone gives beyond an MPNN's reach, the labels of a farther region say
little about a node's own (its features may still say more).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from scipy.spatial import cKDTree
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from torch import Tensor

from kmipgt.analysis.hops import hop_distance_blocks, undirected_adjacency


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


def nearest_labels_accuracy(
    coords: Tensor, y: Tensor, train_mask: Tensor, test_mask: Tensor, k: int
) -> float:
    """Test accuracy of the distance-weighted vote of each test node's ``k`` spatially nearest training
    nodes (``coords [N, c]``, ``y [N]``, boolean masks ``[N]``): how much of the label its labelled
    surroundings give away, without any features."""
    points, labels = coords.double().numpy(), y.numpy()
    train, test = train_mask.numpy(), test_mask.numpy()
    vote = KNeighborsClassifier(min(k, int(train.sum())), weights="distance")
    vote.fit(points[train], labels[train])
    return float(vote.score(points[test], labels[test]))


def label_agreement_by_hops(
    y: Tensor, edge_index: Tensor, rings: tuple[tuple[int, int], ...], num_sources: int = 2000, seed: int = 0
) -> dict[str, tuple[float, float]]:
    r"""How often two nodes ``lo..hi`` hops apart (inclusive, shortest path, direction ignored) share a label.

    For each ``(lo, hi)`` in ``rings``: ``(same, expected)``, the share of node pairs that far apart with the
    same label, and the share expected if labels were independent of each other given each side's label
    mix in those pairs, :math:`\sum_c P(\text{source} = c)\, P(\text{target} = c)` (random pairs of a
    ring sample some regions more than others, and labels follow regions, so the global
    :math:`\sum_c p_c^2` would be the wrong baseline). Pairs are counted from ``num_sources`` random source
    nodes to every node (all nodes if there are fewer): that many BFS, each stopped at the largest ``hi``.
    A ring with no pairs is left out; keys read ``"lo"`` or ``"lo-hi"``.

    ``y [N]`` integer labels >= 0 (N >= 1), ``edge_index [2, E]``.
    """
    if not rings or any(lo < 1 or hi < lo for lo, hi in rings):
        raise ValueError(f"rings must be one or more (lo, hi) with 1 <= lo <= hi, got {rings}")
    if num_sources < 1:
        raise ValueError(f"num_sources must be at least 1, got {num_sources}")
    if y.dim() != 1 or y.numel() == 0 or y.is_floating_point() or int(y.min()) < 0:
        raise ValueError(f"y must be [N] integer labels >= 0, got {y.dtype} {list(y.shape)}")
    n, labels = y.numel(), y.numpy()
    classes = int(labels.max()) + 1
    adjacency = undirected_adjacency(edge_index, n)
    sources = np.sort(np.random.default_rng(seed).choice(n, size=min(num_sources, n), replace=False))
    cap = max(hi for _, hi in rings)
    same = np.zeros(len(rings))
    source_mix = np.zeros((len(rings), classes))
    target_mix = np.zeros((len(rings), classes))
    for block, hops in hop_distance_blocks(adjacency, sources, cap):
        source_labels = labels[sources[block]]
        agree = source_labels[:, None] == labels[None, :]
        for i, (lo, hi) in enumerate(rings):
            in_ring = (hops >= lo) & (hops <= hi)
            same[i] += (in_ring & agree).sum()
            source_mix[i] += np.bincount(source_labels, weights=in_ring.sum(1), minlength=classes)
            target_mix[i] += np.bincount(labels, weights=in_ring.sum(0), minlength=classes)
    rows = {}
    for i, (lo, hi) in enumerate(rings):
        total = source_mix[i].sum()
        if total > 0:
            expected = float(source_mix[i] @ target_mix[i] / total**2)
            rows[f"{lo}" if lo == hi else f"{lo}-{hi}"] = (float(same[i] / total), expected)
    return rows


def neighbourhood_probe(
    x: Tensor,
    y: Tensor,
    edge_index: Tensor,
    train_mask: Tensor,
    test_mask: Tensor,
    coords: Tensor | None = None,
    hops: tuple[int, ...] = (0, 2, 4, 8, 16),
    spatial_k: tuple[int, ...] = (16, 64, 256, 1024),
    label_k: tuple[int, ...] = (1, 5, 15),
    seed: int = 0,
) -> dict[str, float]:
    """Test accuracy of a logistic regression on neighbourhood-averaged node features.

    Rows: ``"hops<=h"`` (raw features and their 2-, 4-, ... h-step walk means, concatenated),
    ``"spatial k"`` (raw features and their mean over the k nearest nodes by ``coords``) and
    ``"hops<=H + spatial k"`` (both, H the largest hop count up to 8, what an 8-layer MPNN could see),
    and ``"nearest labels k"`` (:func:`nearest_labels_accuracy`: no features, the training labels around).

    Args:
        x: node features ``[N, F]``.
        y: class labels ``[N]``.
        edge_index: ``[2, E]`` (direction is ignored).
        train_mask, test_mask: boolean ``[N]``.
        coords: node positions ``[N, c]`` (the spatial and nearest-labels rows are skipped without them).
        hops: hop counts to report (0 = raw features).
        spatial_k: neighbourhood sizes of the spatial rows.
        label_k: training nodes voting in the nearest-labels rows.
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
    for k in label_k:
        rows[f"nearest labels {k}"] = nearest_labels_accuracy(coords, y, train_mask, test_mask, k)
    return rows
