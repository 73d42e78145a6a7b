"""kmipgt: graph transformers with exact k-MIP attention and GRF topological masking."""

__version__ = "0.1.0"
