"""The City-Networks random split (seed-0 permutation, 10% train, 10% validation, 80% test), and the same
split redrawn with another seed."""

from __future__ import annotations

import numpy as np
import torch
from torch_geometric.utils import index_to_mask as pyg_index_to_mask


def random_split_masks(
    num_nodes: int, train_fraction: float = 0.1, val_fraction: float = 0.1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Boolean ``[num_nodes]`` train/val/test masks from ``numpy.random.RandomState(seed).permutation``.

    As in the City-Networks generator: the first ``int(n * train_fraction)`` permuted nodes train, the next
    ``int(n * val_fraction)`` validate and the rest test.
    """
    if num_nodes < 0:
        raise ValueError(f"num_nodes must be >= 0, got {num_nodes}")
    if min(train_fraction, val_fraction) < 0.0 or train_fraction + val_fraction > 1.0:
        raise ValueError("train_fraction and val_fraction must be >= 0 with sum <= 1, "
                         f"got {train_fraction}, {val_fraction}")
    num_train, num_val = int(num_nodes * train_fraction), int(num_nodes * val_fraction)
    return _permuted_parts(torch.arange(num_nodes), seed, num_train, num_val, num_nodes)


def _permuted_parts(
    nodes: torch.Tensor, seed: int, num_train: int, num_val: int, num_nodes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``nodes [M]`` permuted by ``RandomState(seed)`` and cut into ``[num_nodes]`` masks: the first
    ``num_train``, the next ``num_val``, the rest."""
    nodes = nodes[torch.from_numpy(np.random.RandomState(seed).permutation(nodes.numel()))]
    parts = (nodes[:num_train], nodes[num_train : num_train + num_val], nodes[num_train + num_val :])
    return tuple(pyg_index_to_mask(part, num_nodes) for part in parts)


def redraw_split_masks(
    train_mask: torch.Tensor, val_mask: torch.Tensor, test_mask: torch.Tensor, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Disjoint boolean ``[N]`` masks ``(train, val, test)`` of the same sizes over the same nodes, redrawn.

    The nodes of the three masks, in increasing order, are permuted by ``numpy.random.RandomState(seed)``;
    the first ``train_mask.sum()`` train, the next ``val_mask.sum()`` validate and the rest test, so on a
    split of every node this is :func:`random_split_masks` with the same sizes. Nodes outside every mask
    stay outside. One split scores every training seed of a run, so comparing models over several splits
    tells a model's gain apart from the luck of which nodes a small validation or test set holds.
    """
    masks = (train_mask, val_mask, test_mask)
    if any(m.dtype != torch.bool or m.shape != train_mask.shape or m.dim() != 1 for m in masks):
        raise ValueError("train_mask, val_mask and test_mask must be boolean masks of one shape [N]")
    if bool((train_mask & val_mask).any() | (train_mask & test_mask).any() | (val_mask & test_mask).any()):
        raise ValueError("train_mask, val_mask and test_mask overlap; a split's parts must be disjoint")
    nodes = torch.nonzero(train_mask | val_mask | test_mask).flatten()
    return _permuted_parts(nodes, seed, int(train_mask.sum()), int(val_mask.sum()), train_mask.numel())


def index_to_mask(index: torch.Tensor, num_nodes: int, name: str = "index") -> torch.Tensor:
    """Boolean ``[num_nodes]`` mask from an index tensor; boolean masks of that length pass through.

    PyG's ``index_to_mask`` plus what user-supplied mask files need: City-Networks copies hold either
    boolean masks or index lists, and an out-of-range index is an error naming the file, not a crash.
    """
    index = torch.as_tensor(index)
    if index.dtype == torch.bool:
        if index.shape != (num_nodes,):
            raise ValueError(f"{name}: boolean mask must have shape ({num_nodes},), got {tuple(index.shape)}")
        return index
    if index.dim() != 1 or index.dtype.is_floating_point:
        raise ValueError(f"{name}: expected a boolean mask or a 1-D integer index tensor, got {index.dtype}")
    index = index.long()
    if index.numel() and (int(index.min()) < 0 or int(index.max()) >= num_nodes):
        raise ValueError(f"{name}: indices must lie in [0, {num_nodes}), got range "
                         f"[{int(index.min())}, {int(index.max())}]")
    return pyg_index_to_mask(index, num_nodes)
