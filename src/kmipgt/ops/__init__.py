"""Pure tensor functions: exact top-k inner-product search and k-MIP attention on ragged graphs.

Everything here takes tensors and returns tensors (no modules, no PyG objects), so it drops into any
model: ``kmip_attention(q, k, v, k=16, batch=batch)``.
"""

from kmipgt.ops.attention import AttentionSelection, kmip_attention
from kmipgt.ops.full_softmax import full_attention, full_attention_topk
from kmipgt.ops.ragged import RaggedLayout, graph_ptr
from kmipgt.ops.search.dispatch import APPROXIMATE_BACKENDS, SEARCH_BACKENDS, topk_inner_product
from kmipgt.ops.search.ivf_common import ProbeCalibration

__all__ = [
    "APPROXIMATE_BACKENDS",
    "SEARCH_BACKENDS",
    "AttentionSelection",
    "ProbeCalibration",
    "RaggedLayout",
    "full_attention",
    "full_attention_topk",
    "graph_ptr",
    "kmip_attention",
    "topk_inner_product",
]
