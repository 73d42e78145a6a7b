"""Input encoders: raw node features (numbers or category ids), Fourier features of coordinates, LapPE/RWSE,
edge features."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kmipgt.nn.choices import ATTENTION_QK
from kmipgt.nn.padding import masked_batch_norm


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


class CategoricalEncoder(torch.nn.Module):
    r"""One learned embedding per categorical column, summed (OGB's ``AtomEncoder`` and ``BondEncoder``).

    .. math::
        \mathbf{h}_i = \sum_{c} E_c[x_{i,c}], \qquad E_c \in \mathbb{R}^{\text{sizes}[c] \times C}

    Each table starts Xavier-uniform, as OGB's. Category ids are not magnitudes: a linear map of them would
    put carbon (6), nitrogen (7) and oxygen (8) on one axis, each a step further than the last.

    Args:
        sizes: the number of categories of each column (its ids lie in ``[0, size)``).
        channels: output size C.
    """

    def __init__(self, sizes: tuple[int, ...] | list[int], channels: int):
        super().__init__()
        if not sizes or any(size <= 0 for size in sizes):
            raise ValueError(f"sizes must be positive category counts, one per column, got {list(sizes)}")
        self.sizes = tuple(sizes)
        self.embeddings = torch.nn.ModuleList(torch.nn.Embedding(size, channels) for size in self.sizes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for embedding in self.embeddings:
            torch.nn.init.xavier_uniform_(embedding.weight)

    def forward(self, x: Tensor) -> Tensor:
        """``x [N, len(sizes)]`` integer category ids -> ``[N, channels]``."""
        if x.dim() != 2 or x.size(1) != len(self.sizes) or x.is_floating_point():
            raise ValueError(
                f"x must hold integer category ids of shape [N, {len(self.sizes)}], got {x.dtype} "
                f"{list(x.shape)}"
            )
        x = x.long()  # stored compactly (uint8); embedding tables are indexed by int64
        out = self.embeddings[0](x[:, 0])
        for column in range(1, len(self.sizes)):
            out = out + self.embeddings[column](x[:, column])
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({list(self.sizes)}, {self.embeddings[0].embedding_dim})"


class NodeEncoder(torch.nn.Module):
    r"""Sum of linear embeddings of the raw features and of the optional encodings.

    .. math::
        \mathbf{h}_i = W_x \mathbf{x}_i + W_F\,\gamma(\mathbf{x}_{i,\text{coords}})
        + W_L\,\mathbf{p}^{\text{Lap}}_i + W_R\,\mathbf{p}^{\text{RW}}_i

    Where the features are category ids (``categories``), :math:`W_x \mathbf{x}_i` is their
    :class:`CategoricalEncoder` instead. With ``pe_channels`` the encodings take their own channels,
    :math:`\mathbf{h}_i = [W_x \mathbf{x}_i \Vert
    W_L \mathbf{p}^{\text{Lap}}_i + W_R \mathbf{p}^{\text{RW}}_i]`
    (GraphGPS's concatenated encodings), with :math:`W_x` mapping to ``channels - pe_channels``.

    During training the sign of every Laplacian eigenvector is flipped at random (eigenvectors are only
    defined up to sign; GraphGPS does the same).

    Args:
        in_channels: raw node feature size.
        channels: output size.
        coord_columns: columns of ``x`` holding coordinates for the Fourier features.
        num_frequencies: Fourier octaves (0 disables the Fourier features).
        lappe_dim: LapPE size (0 disables it).
        rwse_dim: RWSE size (0 disables it).
        categories: the number of categories of each column of ``x`` where its columns are category ids
            (then ``in_channels`` of them); empty: ``x`` holds numbers.
        pe_channels: channels of the encodings (LapPE, RWSE), concatenated after the features' (0: every part
            maps to all ``channels`` and they are summed).
        rwse_norm: batch-normalise the raw random-walk probabilities before their projection (GraphGPS's
            ``raw_norm_type: BatchNorm``): they span orders of magnitude, the first steps' far larger.
        attention_qk: what the attention's queries and keys are projected from (:meth:`attention_inputs`):
            ``"hidden"`` (the layer input, as in GraphGPS: no input of the encoder's), ``"encoding"``
            (the positional encodings of :meth:`encodings`: Fourier features of the coordinates, LapPE,
            RWSE), so that attention finds keys by position, or ``"position"`` (the Fourier features of the
            coordinates only: LapPE's and RWSE's structural similarity is blind to location). Values
            always come from the layer input.
    """

    def __init__(
        self,
        in_channels: int,
        channels: int,
        coord_columns: list[int] | tuple[int, ...] = (),
        num_frequencies: int = 0,
        lappe_dim: int = 0,
        rwse_dim: int = 0,
        categories: tuple[int, ...] | list[int] = (),
        pe_channels: int = 0,
        rwse_norm: bool = False,
        attention_qk: str = "hidden",
    ):
        super().__init__()
        if in_channels <= 0:
            raise ValueError(f"in_channels must be positive, got {in_channels}")
        if any(not 0 <= c < in_channels for c in coord_columns):
            raise ValueError(f"coord_columns must index x's {in_channels} columns, got {list(coord_columns)}")
        if num_frequencies > 0 and not coord_columns:
            raise ValueError("num_frequencies > 0 needs coord_columns")
        if categories and len(categories) != in_channels:
            raise ValueError(f"categories must give one size per column of x ({in_channels}), got "
                             f"{list(categories)}")
        if (pe_channels and not (lappe_dim or rwse_dim)) or not 0 <= pe_channels < channels:
            raise ValueError(
                f"pe_channels must lie in [0, {channels}) and needs LapPE or RWSE, got {pe_channels}"
            )
        if rwse_norm and not rwse_dim:
            raise ValueError("rwse_norm needs rwse_dim > 0")
        self.coord_columns = list(coord_columns)
        self.pe_channels = pe_channels
        features, encodings = channels - pe_channels, pe_channels or channels
        self.lin_x = None if categories else torch.nn.Linear(in_channels, features)
        self.embed_x = CategoricalEncoder(categories, features) if categories else None
        self.fourier = FourierFeatures(num_frequencies) if num_frequencies > 0 else None
        self.lin_fourier = (
            torch.nn.Linear(2 * len(self.coord_columns) * num_frequencies, features) if self.fourier else None
        )
        self.lin_lappe = torch.nn.Linear(lappe_dim, encodings) if lappe_dim > 0 else None
        self.norm_rwse = torch.nn.BatchNorm1d(rwse_dim) if rwse_norm else None
        self.lin_rwse = torch.nn.Linear(rwse_dim, encodings) if rwse_dim > 0 else None
        self.in_channels, self.channels = in_channels, channels
        self.position_channels = 2 * len(self.coord_columns) * num_frequencies
        self.encoding_channels = self.position_channels + lappe_dim + rwse_dim
        self.attention_qk = attention_qk
        self.qk_channels = self._qk_channels()

    def _qk_channels(self) -> int | None:
        """The size of :meth:`attention_inputs` (None: the attention projects the layer input)."""
        if self.attention_qk not in ATTENTION_QK:
            raise ValueError(f"attention_qk must be one of {ATTENTION_QK}, got {self.attention_qk!r}")
        if self.attention_qk == "hidden":
            return None
        size = self.encoding_channels if self.attention_qk == "encoding" else self.position_channels
        if size == 0:
            raise ValueError(
                f"attention_qk={self.attention_qk!r} needs coord_columns + num_frequencies"
                + (", LapPE or RWSE" if self.attention_qk == "encoding" else "")
            )
        return size

    def reset_parameters(self) -> None:
        for module in (self.lin_x, self.embed_x, self.lin_fourier, self.lin_lappe, self.norm_rwse,
                       self.lin_rwse):
            if module is not None:
                module.reset_parameters()

    def encodings(
        self, x: Tensor, lappe: Tensor | None = None, rwse: Tensor | None = None, structural: bool = True
    ) -> Tensor:
        """The positional part of the input, unprojected: ``[γ(coords) ‖ lappe ‖ rwse]``, ``[N, P]``.

        What attention queries and keys see when they are meant to find nodes by position and structure
        rather than by their hidden state (``attention_qk="encoding"``); with ``structural=False`` only the
        Fourier features of the coordinates (``attention_qk="position"``). LapPE keeps its stored signs
        here: a random flip would move every key between steps.
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

    def attention_inputs(
        self, x: Tensor, lappe: Tensor | None = None, rwse: Tensor | None = None
    ) -> Tensor | None:
        """What the attention's queries and keys are projected from, ``[N, qk_channels]``, as
        ``attention_qk`` says: None for ``"hidden"`` (the layer input), else :meth:`encodings`."""
        if self.qk_channels is None:
            return None
        return self.encodings(x, lappe, rwse, structural=self.attention_qk == "encoding")

    def forward(
        self, x: Tensor, lappe: Tensor | None = None, rwse: Tensor | None = None,
        node_mask: Tensor | None = None,
    ) -> Tensor:
        """``x [N, F_in]`` (numbers, or integer category ids), ``lappe [N, L]``, ``rwse [N, R]`` ->
        ``[N, channels]``. ``node_mask [N]`` (bool, True: real): in a padded batch, the rows whose RWSE
        BatchNorm statistics count (None: every row)."""
        h = self.lin_x(x) if self.embed_x is None else self.embed_x(x)
        if self.fourier is not None:
            h = h + self.lin_fourier(self.fourier(x[:, self.coord_columns]))
        # Summed into h, or, with pe_channels, into their own block concatenated after it.
        encoded = None if self.pe_channels else h
        if self.lin_lappe is not None:
            if lappe is None:
                raise ValueError("this encoder was built with lappe_dim > 0 but got no lappe tensor")
            if self.training:
                lappe = lappe * (torch.randint(0, 2, (1, lappe.size(1)), device=lappe.device) * 2 - 1)
            encoded = _plus(encoded, self.lin_lappe(lappe))
        if self.lin_rwse is not None:
            if rwse is None:
                raise ValueError("this encoder was built with rwse_dim > 0 but got no rwse tensor")
            if self.norm_rwse is not None:
                rwse = masked_batch_norm(self.norm_rwse, rwse, node_mask)
            encoded = _plus(encoded, self.lin_rwse(rwse))
        if encoded is None:
            return h
        return torch.cat([h, encoded], dim=-1) if self.pe_channels else encoded


def build_node_encoder(
    encoder: NodeEncoder | dict[str, Any] | None, in_channels: int, channels: int
) -> NodeEncoder:
    """A model's node encoder: ``encoder`` itself, checked against the model's sizes, or the
    :class:`NodeEncoder` its keyword arguments describe (TypeError naming an option it does not take)."""
    if not isinstance(encoder, NodeEncoder):
        return NodeEncoder(in_channels, channels, **(encoder or {}))
    if (encoder.in_channels, encoder.channels) != (in_channels, channels):
        raise ValueError(
            f"encoder maps {encoder.in_channels} -> {encoder.channels} channels; the model needs "
            f"{in_channels} -> {channels}"
        )
    return encoder


def _plus(total: Tensor | None, term: Tensor) -> Tensor:
    return term if total is None else total + term


class EdgeEncoder(torch.nn.Module):
    """Linear embedding of edge features, a :class:`CategoricalEncoder` of them where they are category ids,
    or one learned vector for every edge when there are none.

    Args:
        in_channels: edge feature size (0: featureless edges).
        channels: output size.
        categories: the number of categories of each edge feature where they are category ids (then
            ``in_channels`` of them); empty: numbers.
    """

    def __init__(self, in_channels: int, channels: int, categories: tuple[int, ...] | list[int] = ()):
        super().__init__()
        if categories and len(categories) != in_channels:
            raise ValueError(f"categories must give one size per edge feature ({in_channels}), got "
                             f"{list(categories)}")
        self.in_channels = in_channels
        self.channels = channels
        self.lin = torch.nn.Linear(in_channels, channels) if in_channels > 0 and not categories else None
        self.embed = CategoricalEncoder(categories, channels) if categories else None
        if in_channels == 0:
            self.embedding = torch.nn.Parameter(torch.zeros(1, channels))

    def reset_parameters(self) -> None:
        if self.in_channels == 0:
            torch.nn.init.zeros_(self.embedding)
        else:
            (self.lin if self.embed is None else self.embed).reset_parameters()

    def forward(self, edge_attr: Tensor | None, num_edges: int) -> Tensor:
        """``edge_attr [E, in_channels]`` (or ``None`` when featureless) -> ``[E, channels]``."""
        if self.in_channels == 0:
            return self.embedding.expand(num_edges, -1)
        if edge_attr is None or edge_attr.shape != (num_edges, self.in_channels):
            shape = None if edge_attr is None else list(edge_attr.shape)
            raise ValueError(f"edge_attr must have shape [{num_edges}, {self.in_channels}], got {shape}")
        return self.lin(edge_attr) if self.embed is None else self.embed(edge_attr)
