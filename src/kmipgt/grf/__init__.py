"""Graph random features (GRF) topological masking for linear attention, as pure tensor functions.

``sample_walks`` -> ``grf_features`` -> ``masked_linear_attention`` (or ``asymmetric_masked_attention``):
learnable graph masks ``M = Σ_k α_k W^k`` applied to linear attention in O(N) for bounded degree
(Reid et al., "Linear Transformer Topological Masking with Graph Random Features", ICLR 2025).
"""

from kmipgt.grf.attention import (
    asymmetric_masked_attention,
    block_mask,
    linear_attention,
    masked_linear_attention,
    pattern_masked_attention,
)
from kmipgt.grf.feature_maps import FEATURE_MAPS, apply_feature_map, orthogonal_random_features
from kmipgt.grf.features import GRFMaskPattern, grf_feature_values, grf_features, grf_mask, grf_mask_pattern
from kmipgt.grf.sparse import CSRPattern, sampled_dot, sparse_dense_matmul
from kmipgt.grf.walks import GRFWalks, sample_walks

__all__ = [
    "FEATURE_MAPS",
    "CSRPattern",
    "GRFMaskPattern",
    "GRFWalks",
    "apply_feature_map",
    "asymmetric_masked_attention",
    "block_mask",
    "grf_feature_values",
    "grf_features",
    "grf_mask",
    "grf_mask_pattern",
    "linear_attention",
    "masked_linear_attention",
    "orthogonal_random_features",
    "pattern_masked_attention",
    "sample_walks",
    "sampled_dot",
    "sparse_dense_matmul",
]
