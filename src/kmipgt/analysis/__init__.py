"""Analysis of trained models and their data: which keys attention attends to, and statistics of them;
where a label's signal lies (hop vs spatial neighbourhoods).

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
from kmipgt.analysis.probe import hop_means, neighbourhood_probe, spatial_means

__all__ = [
    "EXPLAINABLE_KINDS",
    "HOP_CAP",
    "attended_keys",
    "attention_modules",
    "check_queries",
    "explain",
    "hop_distances",
    "hop_means",
    "neighbourhood_probe",
    "sample_queries",
    "select_layers_heads",
    "spatial_means",
    "undirected_adjacency",
]
