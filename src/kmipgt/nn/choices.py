"""The names the GPS layer, the model and the baselines take as options, without importing torch.

A config's values are checked against these (and against the kind registries) before torch loads, so a
misspelt option is reported at once; the modules that act on the names import them from here.
"""

__all__ = [
    "ACTIVATIONS",
    "ATTENTION_ORDERS",
    "ATTENTION_QK",
    "BASELINE_KINDS",
    "NORM_KINDS",
    "NORM_POSITIONS",
    "POOLINGS",
    "TASKS",
]

NORM_KINDS = ("layer", "batch", "graph")
ACTIVATIONS = ("gelu", "relu")
# The keys of kmipgt.nn.gps_layer's NORM_PLACEMENTS and COMBINERS.
NORM_POSITIONS = ("post", "pre")
ATTENTION_ORDERS = ("parallel", "series")
TASKS = ("node", "graph", "edge")
POOLINGS = ("mean", "sum")
ATTENTION_QK = ("hidden", "encoding", "position")
BASELINE_KINDS = ("mlp", "gcn", "sage", "gat", "sgformer", "polynormer")
