"""Neural-network modules: global attention (one projection, a core per registered kind: k-MIP, full,
Performer, GRF), local MPNN kinds, GPS layers, PyG's GPSConv with k-MIP, the model, PyG baselines."""

from kmipgt.nn.attention import (
    FullAttention,
    GRFAttention,
    KMIPAttention,
    PerformerAttention,
    ProjectedAttention,
    build_global_attention,
)
from kmipgt.nn.attention_kinds import ATTENTION_KINDS, AttentionKind
from kmipgt.nn.baselines import BASELINE_KINDS, BaselineModel
from kmipgt.nn.cores import AttentionCore, FullCore, KMIPCore, PerformerCore
from kmipgt.nn.encoders import EdgeEncoder, FourierFeatures, NodeEncoder
from kmipgt.nn.gated_gcn import GatedGCNLayer
from kmipgt.nn.gps_conv import KMIPGPSConv
from kmipgt.nn.gps_layer import GPSLayer, build_norm
from kmipgt.nn.grf_core import GRFCore, GRFWalkCache, share_walk_caches
from kmipgt.nn.local_kinds import LOCAL_KINDS, LocalKind, build_local_mpnn
from kmipgt.nn.model import GraphTransformer, MLPHead

__all__ = [
    "ATTENTION_KINDS",
    "BASELINE_KINDS",
    "LOCAL_KINDS",
    "AttentionCore",
    "AttentionKind",
    "BaselineModel",
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
