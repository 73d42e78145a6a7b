"""Neural-network modules: global attention (one projection, a core per registered kind: k-MIP, full,
Performer, GRF), local MPNN kinds, GPS layers, PyG's GPSConv with k-MIP, the model, PyG baselines.

The names below are imported on first use (:func:`kmipgt.lazy.lazy_package`), so that the kind registries and
:mod:`kmipgt.nn.choices` load without torch: a config's names are checked before torch is imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kmipgt.lazy import lazy_package

if TYPE_CHECKING:
    from kmipgt.nn.attention import (
        FullAttention,
        GRFAttention,
        KMIPAttention,
        PerformerAttention,
        ProjectedAttention,
        build_global_attention,
    )
    from kmipgt.nn.attention_kinds import ATTENTION_KINDS, AttentionKind
    from kmipgt.nn.baselines import BaselineModel
    from kmipgt.nn.choices import BASELINE_KINDS
    from kmipgt.nn.cores import AttentionCore, FullCore, KMIPCore, PerformerCore
    from kmipgt.nn.encoders import CategoricalEncoder, EdgeEncoder, FourierFeatures, NodeEncoder
    from kmipgt.nn.gated_gcn import GatedGCNLayer
    from kmipgt.nn.gps_conv import KMIPGPSConv
    from kmipgt.nn.gps_layer import GPSLayer, build_norm
    from kmipgt.nn.grf_core import GRFCore, GRFWalkCache, share_walk_caches
    from kmipgt.nn.local_kinds import LOCAL_KINDS, LocalKind, build_local_mpnn
    from kmipgt.nn.model import GraphTransformer, MLPHead

# Public name -> the submodule that defines it.
_SOURCES = {
    "ATTENTION_KINDS": "attention_kinds",
    "AttentionCore": "cores",
    "AttentionKind": "attention_kinds",
    "BASELINE_KINDS": "choices",
    "BaselineModel": "baselines",
    "CategoricalEncoder": "encoders",
    "EdgeEncoder": "encoders",
    "FourierFeatures": "encoders",
    "FullAttention": "attention",
    "FullCore": "cores",
    "GPSLayer": "gps_layer",
    "GRFAttention": "attention",
    "GRFCore": "grf_core",
    "GRFWalkCache": "grf_core",
    "GatedGCNLayer": "gated_gcn",
    "GraphTransformer": "model",
    "KMIPAttention": "attention",
    "KMIPCore": "cores",
    "KMIPGPSConv": "gps_conv",
    "LOCAL_KINDS": "local_kinds",
    "LocalKind": "local_kinds",
    "MLPHead": "model",
    "NodeEncoder": "encoders",
    "PerformerAttention": "attention",
    "PerformerCore": "cores",
    "ProjectedAttention": "attention",
    "build_global_attention": "attention",
    "build_local_mpnn": "local_kinds",
    "build_norm": "gps_layer",
    "share_walk_caches": "grf_core",
}

__all__ = [
    "ATTENTION_KINDS",
    "BASELINE_KINDS",
    "LOCAL_KINDS",
    "AttentionCore",
    "AttentionKind",
    "BaselineModel",
    "CategoricalEncoder",
    "EdgeEncoder",
    "FourierFeatures",
    "FullAttention",
    "FullCore",
    "GPSLayer",
    "GRFAttention",
    "GRFCore",
    "GRFWalkCache",
    "GatedGCNLayer",
    "GraphTransformer",
    "KMIPAttention",
    "KMIPCore",
    "KMIPGPSConv",
    "LocalKind",
    "MLPHead",
    "NodeEncoder",
    "PerformerAttention",
    "PerformerCore",
    "ProjectedAttention",
    "build_global_attention",
    "build_local_mpnn",
    "build_norm",
    "share_walk_caches",
]


lazy_package(__name__, _SOURCES)
