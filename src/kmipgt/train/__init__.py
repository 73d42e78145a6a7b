"""Training and evaluation: configs, metrics, the training loop with exact resume, run reports."""

from kmipgt.train.config import Config, load_config
from kmipgt.train.metrics import METRICS, compute_metric
from kmipgt.train.trainer import SplitGraph, Trainer, build_model, evaluate_run, load_run, split_graph, train

__all__ = [
    "METRICS",
    "Config",
    "SplitGraph",
    "Trainer",
    "build_model",
    "compute_metric",
    "evaluate_run",
    "load_config",
    "load_run",
    "split_graph",
    "train",
]
