"""Input encoders: raw node features, Fourier features of coordinates, LapPE/RWSE, edge features."""

from __future__ import annotations

import torch
from torch import Tensor


class FourierFeatures(torch.nn.Module):
    r"""Sin/cos features of coordinates at octave-spaced frequencies (City-Networks node encoder).

    .. math::
        \gamma(\mathbf{c}) = \big[\sin(2^f \omega_0 \mathbf{c}),
        \cos(2^f \omega_0 \mathbf{c})\big]_{f=0}^{F-1}, \qquad \omega_0 = \pi / 4

    Coordinates are expected standardised (the training pipeline z-scores them). The longest period,
    8, exceeds the span of standardised coordinates (|z| < 4), so distinct positions never share an
    encoding and :math:`\gamma(\mathbf{a}) \cdot \gamma(\mathbf{b}) = \sum_f \cos(2^f \omega_0
    (\mathbf{a} - \mathbf{b}))` (per coordinate) peaks only at :math:`\mathbf{a} = \mathbf{b}`: nearest
    by this inner product is nearest in space, which position-keyed attention relies on. (A lowest
    frequency of :math:`\pi`, period 2, folds z-scores 2 apart onto each other: the top-16 keys by the
    encodings' inner product then lay 28 hops away on a 10k-node synthetic city instead of 4.)
    ``F`` octaves resolve scales from the whole map down to :math:`8 \cdot 2^{-F}`.

    Args:
        num_frequencies: number of octaves F.
    """

    def __init__(self, num_frequencies: int):
        super().__init__()
        if num_frequencies <= 0:
            raise ValueError(f"num_frequencies must be positive, got {num_frequencies}")
        self.num_frequencies = num_frequencies
        self.register_buffer("frequencies", torch.pi / 4 * 2.0 ** torch.arange(num_frequencies))

    def forward(self, coords: Tensor) -> Tensor:
        """``coords [N, c]`` -> ``[N, 2·c·F]``."""
        angles = (coords.unsqueeze(-1) * self.frequencies).flatten(1)
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(num_frequencies={self.num_frequencies})"


class NodeEncoder(torch.nn.Module):
    r"""Sum of linear embeddings of the raw features and of the optional encodings.

    .. math::
        \mathbf{h}_i = W_x \mathbf{x}_i + W_F\,\gamma(\mathbf{x}_{i,\text{coords}})
        + W_L\,\mathbf{p}^{\text{Lap}}_i + W_R\,\mathbf{p}^{\text{RW}}_i

    During training the sign of every Laplacian eigenvector is flipped at random (eigenvectors are only
    defined up to sign; GraphGPS does the same).

    Args:
        in_channels: raw node feature size.
        channels: output size.
        coord_columns: columns of ``x`` holding coordinates for the Fourier features.
        num_frequencies: Fourier octaves (0 disables the Fourier features).
        lappe_dim: LapPE size (0 disables it).
        rwse_dim: RWSE size (0 disables it).
    """

    def __init__(
        self,
        in_channels: int,
        channels: int,
        coord_columns: list[int] | tuple[int, ...] = (),
        num_frequencies: int = 0,
        lappe_dim: int = 0,
        rwse_dim: int = 0,
    ):
        super().__init__()
        if in_channels <= 0:
            raise ValueError(f"in_channels must be positive, got {in_channels}")
        if any(not 0 <= c < in_channels for c in coord_columns):
            raise ValueError(f"coord_columns must index x's {in_channels} columns, got {list(coord_columns)}")
        if num_frequencies > 0 and not coord_columns:
            raise ValueError("num_frequencies > 0 needs coord_columns")
        self.coord_columns = list(coord_columns)
        self.lin_x = torch.nn.Linear(in_channels, channels)
        self.fourier = FourierFeatures(num_frequencies) if num_frequencies > 0 else None
        self.lin_fourier = (
            torch.nn.Linear(2 * len(self.coord_columns) * num_frequencies, channels) if self.fourier else None
        )
        self.lin_lappe = torch.nn.Linear(lappe_dim, channels) if lappe_dim > 0 else None
        self.lin_rwse = torch.nn.Linear(rwse_dim, channels) if rwse_dim > 0 else None
        self.position_channels = 2 * len(self.coord_columns) * num_frequencies
        self.encoding_channels = self.position_channels + lappe_dim + rwse_dim

    def reset_parameters(self) -> None:
        for lin in (self.lin_x, self.lin_fourier, self.lin_lappe, self.lin_rwse):
            if lin is not None:
                lin.reset_parameters()

    def encodings(
        self, x: Tensor, lappe: Tensor | None = None, rwse: Tensor | None = None, structural: bool = True
    ) -> Tensor:
        """The positional part of the input, unprojected: ``[γ(coords) ‖ lappe ‖ rwse]``, ``[N, P]``.

        What attention queries and keys see when they are meant to find nodes by position and structure
        rather than by their hidden state (``GraphTransformer(attention_qk="encoding")``); with
        ``structural=False`` only the Fourier features of the coordinates (``attention_qk="position"``).
        LapPE keeps its stored signs here: a random flip would move every key between steps.
        """
        size = self.encoding_channels if structural else self.position_channels
        if size == 0:
            wanted = "positional encodings (coords, LapPE or RWSE)" if structural else "coordinate features"
            raise ValueError(f"the node encoder has no {wanted}")
        parts = [self.fourier(x[:, self.coord_columns])] if self.fourier is not None else []
        if structural:
            parts += [t for t, lin in ((lappe, self.lin_lappe), (rwse, self.lin_rwse)) if lin is not None]
        if any(t is None for t in parts):
            raise ValueError("this encoder was built with LapPE/RWSE but got no lappe/rwse tensor")
        return torch.cat(parts, dim=-1)

    def forward(self, x: Tensor, lappe: Tensor | None = None, rwse: Tensor | None = None) -> Tensor:
        """``x [N, F_in]``, ``lappe [N, L]``, ``rwse [N, R]`` -> ``[N, channels]``."""
        h = self.lin_x(x)
        if self.fourier is not None:
            h = h + self.lin_fourier(self.fourier(x[:, self.coord_columns]))
        if self.lin_lappe is not None:
            if lappe is None:
                raise ValueError("this encoder was built with lappe_dim > 0 but got no lappe tensor")
            if self.training:
                lappe = lappe * (torch.randint(0, 2, (1, lappe.size(1)), device=lappe.device) * 2 - 1)
            h = h + self.lin_lappe(lappe)
        if self.lin_rwse is not None:
            if rwse is None:
                raise ValueError("this encoder was built with rwse_dim > 0 but got no rwse tensor")
            h = h + self.lin_rwse(rwse)
        return h


class EdgeEncoder(torch.nn.Module):
    """Linear embedding of edge features, or one learned vector for every edge when there are none.

    Args:
        in_channels: edge feature size (0: featureless edges).
        channels: output size.
    """

    def __init__(self, in_channels: int, channels: int):
        super().__init__()
        self.in_channels = in_channels
        self.channels = channels
        if in_channels > 0:
            self.lin = torch.nn.Linear(in_channels, channels)
        else:
            self.embedding = torch.nn.Parameter(torch.zeros(1, channels))

    def reset_parameters(self) -> None:
        if self.in_channels > 0:
            self.lin.reset_parameters()
        else:
            torch.nn.init.zeros_(self.embedding)

    def forward(self, edge_attr: Tensor | None, num_edges: int) -> Tensor:
        """``edge_attr [E, in_channels]`` (or ``None`` when featureless) -> ``[E, channels]``."""
        if self.in_channels == 0:
            return self.embedding.expand(num_edges, -1)
        if edge_attr is None or edge_attr.shape != (num_edges, self.in_channels):
            shape = None if edge_attr is None else list(edge_attr.shape)
            raise ValueError(f"edge_attr must have shape [{num_edges}, {self.in_channels}], got {shape}")
        return self.lin(edge_attr)
