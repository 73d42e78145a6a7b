"""Analysis of trained models and their data: which keys attention attends to, and statistics of them;
the tokens every k-MIP layer attends with; where a label's signal lies (hop vs spatial neighbourhoods,
how far apart nodes still share a label);
the S-SEG-WL test that bounds which graphs GraphGPS can tell apart.

Takes a model and its data (the CLI loads a run through :mod:`kmipgt.train` and hands both in); never
imports :mod:`kmipgt.train` itself.
"""

from kmipgt.analysis.explain import (
    HOP_CAP,
    attended_keys,
    attention_modules,
    check_queries,
    explain,
    explain_graphs,
    explainable_kinds,
    run_forward,
    sample_queries,
    select_layers_heads,
)
from kmipgt.analysis.explain_stats import share_beyond, summary_rows
from kmipgt.analysis.hops import hop_distances, undirected_adjacency
from kmipgt.analysis.probe import (
    hop_means,
    label_agreement_by_hops,
    nearest_labels_accuracy,
    neighbourhood_probe,
    spatial_means,
)
from kmipgt.analysis.seg_wl import WLResult, seg_wl
from kmipgt.analysis.tokens import LayerTokens, collect_tokens, kmip_layers, load_tokens, save_tokens

__all__ = [
    "HOP_CAP",
    "LayerTokens",
    "WLResult",
    "attended_keys",
    "attention_modules",
    "check_queries",
    "collect_tokens",
    "explain",
    "explain_graphs",
    "explainable_kinds",
    "hop_distances",
    "hop_means",
    "kmip_layers",
    "label_agreement_by_hops",
    "load_tokens",
    "nearest_labels_accuracy",
    "neighbourhood_probe",
    "run_forward",
    "sample_queries",
    "save_tokens",
    "seg_wl",
    "select_layers_heads",
    "share_beyond",
    "spatial_means",
    "summary_rows",
    "undirected_adjacency",
]
