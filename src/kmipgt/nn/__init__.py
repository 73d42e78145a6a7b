"""Neural-network modules (PyG conventions)."""

from kmipgt.nn.grf_attention import GRFAttention

__all__ = ["GRFAttention"]
