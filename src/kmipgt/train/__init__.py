"""Training, evaluation and predictions: configs, metrics, the training loop with exact resume, run reports.

The names below are imported on first use (:func:`kmipgt.lazy.lazy_package`), so reading and checking a config
(:mod:`kmipgt.train.config`) does not import torch or PyG: ``kmipgt train`` reports a bad key at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kmipgt.lazy import lazy_package

if TYPE_CHECKING:
    from kmipgt.train.compiled import CompiledModel
    from kmipgt.train.config import Config, load_config
    from kmipgt.train.export import export_model, export_run
    from kmipgt.train.loop import Trainer
    from kmipgt.train.metrics import METRICS, compute_metric
    from kmipgt.train.models import build_model
    from kmipgt.train.predictions import predict, write_predictions
    from kmipgt.train.run import evaluate_run, load_run, split_graph, train
    from kmipgt.train.tasks.base import SplitGraph

# Public name -> the submodule that defines it.
_SOURCES = {
    "METRICS": "metrics",
    "CompiledModel": "compiled",
    "Config": "config",
    "SplitGraph": "tasks.base",
    "Trainer": "loop",
    "build_model": "models",
    "compute_metric": "metrics",
    "evaluate_run": "run",
    "export_model": "export",
    "export_run": "export",
    "load_config": "config",
    "load_run": "run",
    "predict": "predictions",
    "split_graph": "run",
    "train": "run",
    "write_predictions": "predictions",
}

__all__ = [
    "METRICS",
    "CompiledModel",
    "Config",
    "SplitGraph",
    "Trainer",
    "build_model",
    "compute_metric",
    "evaluate_run",
    "export_model",
    "export_run",
    "load_config",
    "load_run",
    "predict",
    "split_graph",
    "train",
    "write_predictions",
]


lazy_package(__name__, _SOURCES)
