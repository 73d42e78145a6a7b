"""The budget of ``data.pad_to`` (:mod:`kmipgt.train.padding`), read without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["AUTO", "PadBudget"]

_KEYS = ("nodes", "edges", "graphs")
# ``data.pad_to: auto``: budgets sized from the prepared graphs (kmipgt.train.padding.fitted_budgets).
AUTO = "auto"


@dataclass(frozen=True)
class PadBudget:
    """The fixed size every padded batch has: ``nodes``, ``edges`` and ``graphs`` (real plus padding)."""

    nodes: int
    edges: int
    graphs: int

    @classmethod
    def from_config(cls, values: dict[str, Any] | str) -> PadBudget | None:
        """The budget of ``data.pad_to`` (``{nodes: N, edges: E, graphs: G}``), None where it is empty (off)
        or :data:`AUTO` (sized from the data once it is prepared). ValueError naming the key for another
        string, or a missing, unknown or non-positive entry."""
        if not values or values == AUTO:
            return None
        if isinstance(values, str):
            raise ValueError(f"config key 'data.pad_to' takes {{nodes: N, edges: E, graphs: G}} or {AUTO!r}, "
                             f"got {values!r}")
        unknown = sorted(set(values) - set(_KEYS))
        missing = [key for key in _KEYS if key not in values]
        if unknown or missing:
            raise ValueError(f"config key 'data.pad_to' takes exactly the keys {list(_KEYS)}; "
                             f"missing {missing}, unknown {unknown}")
        for key in _KEYS:
            value = values[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config key 'data.pad_to.{key}' must be a positive int, got {value!r}")
        return cls(values["nodes"], values["edges"], values["graphs"])

    def holds(self, nodes: int, edges: int, graphs: int) -> bool:
        """Whether a batch of ``graphs`` graphs, ``nodes`` nodes and ``edges`` edges packs into this budget:
        nothing over it, and padding edges only with a padding node to hold them, padding nodes only with
        a padding graph."""
        pad_nodes, pad_edges, pad_graphs = self.nodes - nodes, self.edges - edges, self.graphs - graphs
        no_room = (pad_edges and not pad_nodes) or (pad_nodes and not pad_graphs)
        return min(pad_nodes, pad_edges, pad_graphs) >= 0 and not no_room
