"""The training losses a config names (``task.loss``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kmipgt.train.choices import LOSSES

__all__ = ["LOSSES", "compute_loss"]


def compute_loss(name: str, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Training loss ``name`` (one of :data:`LOSSES`)."""
    if name == "cross_entropy":
        return F.cross_entropy(output, target.long())
    if name == "bce":
        return F.binary_cross_entropy_with_logits(output, target.float().view_as(output))
    if name == "l1":
        return F.l1_loss(output, target.float().view_as(output))
    raise ValueError(f"task.loss must be one of {LOSSES}, got {name!r}")
