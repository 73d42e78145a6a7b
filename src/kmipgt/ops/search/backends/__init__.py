"""The search backends, one module each; importing this package registers them all.

A backend module may import the shared modules of :mod:`kmipgt.ops.search` (registry, checks, blockwise
search, kernels, IVF helpers) but never another backend or the dispatcher (tests/ops/test_registry.py).
"""

# The registration order is the listing order of `kmipgt.ops.SEARCH_BACKENDS`: exact, then approximate.
# isort: off
from kmipgt.ops.search.backends import torch_search
from kmipgt.ops.search.backends import keops_search
from kmipgt.ops.search.backends import fused_search
from kmipgt.ops.search.backends import triton_search
from kmipgt.ops.search.backends import ivf_search
from kmipgt.ops.search.backends import faiss_search

# isort: on

__all__ = ["faiss_search", "fused_search", "ivf_search", "keops_search", "torch_search", "triton_search"]
