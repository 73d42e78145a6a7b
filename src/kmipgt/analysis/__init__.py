"""Analysis of trained models: which keys attention attends to, and statistics of them.

Takes a model and its data (the CLI loads a run through :mod:`kmipgt.train` and hands both in); never
imports :mod:`kmipgt.train` itself.
"""

from kmipgt.analysis.explain import (
    EXPLAINABLE_KINDS,
    HOP_CAP,
    attended_keys,
    attention_modules,
    check_queries,
    explain,
    sample_queries,
    select_layers_heads,
)
from kmipgt.analysis.hops import hop_distances, undirected_adjacency

__all__ = [
    "EXPLAINABLE_KINDS",
    "HOP_CAP",
    "attended_keys",
    "attention_modules",
    "check_queries",
    "explain",
    "hop_distances",
    "sample_queries",
    "select_layers_heads",
    "undirected_adjacency",
]
