"""Training and evaluation: configs, metrics, the training loop with exact resume, run reports."""

from kmipgt.train.config import Config, load_config
from kmipgt.train.loop import Trainer
from kmipgt.train.metrics import METRICS, compute_metric
from kmipgt.train.models import build_model
from kmipgt.train.run import evaluate_run, load_run, split_graph, train
from kmipgt.train.task import SplitGraph

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
