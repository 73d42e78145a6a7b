r"""The options of a GPS layer's attention branch, as one object: :class:`AttentionOptions`.

:class:`~kmipgt.nn.gps_layer.GPSLayer` takes them as ``attn_kwargs``, as PyG's ``GPSConv`` does: the
branch's own keys (heads, dropout, gate, order, ...) and, beside them, the options of the attention kind's
core (``k`` and ``backend`` for k-MIP, ``num_walks`` for GRF, ...), which the core checks itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kmipgt.nn.choices import ATTENTION_ORDERS

__all__ = ["AttentionOptions"]


@dataclass(frozen=True)
class AttentionOptions:
    r"""A GPS layer's attention branch: how it is projected, regularised and combined with the local one.

    Args:
        heads: attention heads.
        head_dim: head size (default ``channels // heads``).
        dropout: dropout on the attention weights.
        qk_channels: size of the layer's ``qk_x`` input, where the queries and keys come from it (the
            positional encodings) while the values come from the layer input.
        gate: the attention enters through a per-channel gate :math:`\boldsymbol{\alpha}` initialised at
            zero, :math:`\boldsymbol{\alpha} \odot \mathrm{Drop}(\mathrm{Attn}(\mathbf{h}))`, unnormalised and
            beside the local branch's residual: at initialisation the layer is exactly the MPNN-only layer.
            Needs both branches.
        drop_path: stochastic depth of the branch, per node (torchvision's ``stochastic_depth`` in
            ``"row"`` mode): in training each node's attention output is dropped with this probability and
            the others scaled by :math:`1/(1-p)`.
        order: ``"parallel"`` (GraphGPS: both branches read the layer input) or ``"series"`` (the attention
            first, the MPNN on its output); the combiners of :mod:`kmipgt.nn.gps_layer`.
        core: the options of the attention kind's core, passed on untouched (``{"k": 16}`` for k-MIP).
    """

    heads: int = 4
    head_dim: int | None = None
    dropout: float = 0.0
    qk_channels: int | None = None
    gate: bool = False
    drop_path: float = 0.0
    order: str = "parallel"
    core: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.heads, int) or self.heads <= 0:
            raise ValueError(f"attention heads must be a positive int, got {self.heads!r}")
        if self.head_dim is not None and self.head_dim <= 0:
            raise ValueError(f"attention head_dim must be positive or None, got {self.head_dim!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"attention dropout must be in [0, 1), got {self.dropout}")
        if not 0.0 <= self.drop_path < 1.0:
            raise ValueError(f"attention drop_path must be in [0, 1), got {self.drop_path}")
        if self.order not in ATTENTION_ORDERS:
            raise ValueError(f"attention order must be one of {ATTENTION_ORDERS}, got {self.order!r}")

    @classmethod
    def from_kwargs(cls, attn_kwargs: Mapping[str, Any] | None) -> AttentionOptions:
        """The branch's keys of ``attn_kwargs`` as fields, every other key as an option of the core."""
        core = dict(attn_kwargs or {})
        own = {f.name for f in fields(cls)} - {"core"}
        return cls(**{name: core.pop(name) for name in own if name in core}, core=core)
