"""Neural-network modules: global attention (k-MIP, full, Performer), local MPNNs, GPS layers, the model,
PyG baselines."""

from kmipgt.nn.attention import (
    ATTENTION_KINDS,
    FullAttention,
    KMIPAttention,
    PerformerAttention,
    build_global_attention,
)
from kmipgt.nn.baselines import BASELINE_KINDS, BaselineModel
from kmipgt.nn.encoders import EdgeEncoder, FourierFeatures, NodeEncoder
from kmipgt.nn.gated_gcn import GatedGCNLayer
from kmipgt.nn.gps_layer import GPSLayer, build_local_mpnn, build_norm
from kmipgt.nn.grf_attention import GRFAttention
from kmipgt.nn.model import GraphTransformer, MLPHead

__all__ = [
    "ATTENTION_KINDS",
    "BASELINE_KINDS",
    "BaselineModel",
    "EdgeEncoder",
    "FourierFeatures",
    "FullAttention",
    "GPSLayer",
    "GRFAttention",
    "GatedGCNLayer",
    "GraphTransformer",
    "KMIPAttention",
    "MLPHead",
    "NodeEncoder",
    "PerformerAttention",
    "build_global_attention",
    "build_local_mpnn",
    "build_norm",
]
