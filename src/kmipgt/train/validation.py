"""Whole-config checks that run before a run touches the disk: ranges and names of every key.

:func:`kmipgt.train.config.load_config` already checks key names and types; what it cannot see (``epochs``
0, a misspelt ``task.loss``) would otherwise fail epochs later, after ``config.yaml`` was written, or not
at all (``epochs: 0`` wrote NaN into ``metrics.json``).

Every name is checked against torch-free vocabularies (the registries and the ``choices`` modules), so a
command reports a bad value before it imports torch.
"""

from __future__ import annotations

import math
import re
import reprlib

from kmipgt.data.registry import list_datasets
from kmipgt.distributed.choices import (
    PARTITIONS,
    STRATEGIES,
    partitioned_attention_kinds,
    partitioned_local_kinds,
)
from kmipgt.malloc import ALLOCATORS
from kmipgt.nn.attention_kinds import ATTENTION_KINDS
from kmipgt.nn.choices import (
    ACTIVATIONS,
    ATTENTION_ORDERS,
    ATTENTION_QK,
    NORM_KINDS,
    NORM_POSITIONS,
    POOLINGS,
    TASKS,
)
from kmipgt.nn.local_kinds import LOCAL_KINDS
from kmipgt.train.choices import LOSS_METRICS, LOSSES, METRICS, MODEL_KINDS, PRECISIONS
from kmipgt.train.config import Config, TaskConfig
from kmipgt.train.pad_budget import PadBudget
from kmipgt.train.tensorboard import require_tensorboard

__all__ = ["check_loss_metrics", "validate_config"]


def _at_least(name: str, value: float | None, low: float, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if value is None or not value >= low or (isinstance(value, float) and not math.isfinite(value)):
        extra = " or null" if optional else ""
        raise ValueError(f"config key {name!r} must be >= {low}{extra}, got {value!r}")


def _fraction(name: str, value: float, *, closed: bool) -> None:
    """``value`` in [0, 1] (``closed``) or [0, 1)."""
    if not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):
        raise ValueError(f"config key {name!r} must lie in [0, 1{']' if closed else ')'}, got {value!r}")


def _one_of(name: str, value: str, allowed: tuple[str, ...] | list[str]) -> None:
    if value not in allowed:
        raise ValueError(f"config key {name!r} must be one of {tuple(allowed)}, got {reprlib.repr(value)}")


def _check_data(config: Config) -> None:
    d = config.data
    _one_of("data.name", d.name, list_datasets())
    for key in ("lappe_dim", "rwse_dim"):
        _at_least(f"data.{key}", getattr(d, key), 0)
    _at_least("data.batch_size", d.batch_size, 1)
    _at_least("data.split_index", d.split_index, 0)
    shares = d.split_ratios
    if len(shares) != 3 or min(shares) < 0 or shares[0] <= 0 or abs(sum(shares) - 1) > 1e-6:
        raise ValueError("config key 'data.split_ratios' must be three shares [train, val, test] >= 0 that "
                         f"sum to 1, with some to train, got {shares}")
    _fraction("data.val_edges", d.val_edges, closed=False)
    _fraction("data.test_edges", d.test_edges, closed=False)
    if d.val_edges + d.test_edges >= 1:
        raise ValueError(
            f"config keys 'data.val_edges' + 'data.test_edges' must be < 1 (edges left to train on), "
            f"got {d.val_edges} + {d.test_edges}"
        )


def _check_model(config: Config) -> None:
    m = config.model
    _one_of("model.kind", m.kind, MODEL_KINDS)
    _one_of("model.local", m.local, LOCAL_KINDS.names())
    _one_of("model.norm", m.norm, NORM_KINDS)
    _one_of("model.norm_position", m.norm_position, NORM_POSITIONS)
    _one_of("model.activation", m.activation, ACTIVATIONS)
    _one_of("model.pooling", m.pooling, POOLINGS)
    for key in ("channels", "head_layers"):
        _at_least(f"model.{key}", getattr(m, key), 1)
    _at_least("model.num_layers", m.num_layers, 0)
    _fraction("model.dropout", m.dropout, closed=False)
    _check_encoder(config)
    _check_attention(config)


def _check_encoder(config: Config) -> None:
    e = config.model.encoder
    _one_of("model.encoder.attention_qk", e.attention_qk, ATTENTION_QK)
    for key in ("num_frequencies", "pe_channels"):
        _at_least(f"model.encoder.{key}", getattr(e, key), 0)


def _check_attention(config: Config) -> None:
    a = config.model.attention
    _one_of("model.attention.kind", a.kind, ATTENTION_KINDS.names())
    _one_of("model.attention.order", a.order, ATTENTION_ORDERS)
    for key in ("heads", "k"):
        _at_least(f"model.attention.{key}", getattr(a, key), 1)
    _at_least("model.attention.head_dim", a.head_dim, 1, optional=True)
    _fraction("model.attention.dropout", a.dropout, closed=False)
    _fraction("model.attention.drop_path", a.drop_path, closed=False)
    # AttentionConfig.core_options hands attention.k to the k-MIP core: a second k would silently win.
    if "k" in a.options:
        raise ValueError(
            "config key 'model.attention.options' must not set 'k'; set 'model.attention.k' instead"
        )


def check_loss_metrics(task: TaskConfig) -> None:
    """ValueError unless the metric and every reported metric score the loss's outputs."""
    if task.loss is None:
        return
    allowed = LOSS_METRICS[task.loss]
    for name in (task.metric, *task.report):
        if name is not None and name not in allowed:
            raise ValueError(
                f"config key 'task.metric' {name!r} does not score task.loss {task.loss!r}; its metrics: "
                f"{', '.join(allowed)}"
            )


def _check_task(config: Config) -> None:
    """The task's names, each unless left to the data (null), and whether its metrics score its loss."""
    t = config.task
    for key, allowed in (("level", TASKS), ("loss", LOSSES), ("metric", METRICS)):
        if getattr(t, key) is not None:
            _one_of(f"task.{key}", getattr(t, key), allowed)
    for name in t.report:
        _one_of("task.report", name, METRICS)
    check_loss_metrics(t)


def _check_optim(config: Config) -> None:
    o = config.optim
    for key in ("epochs", "eval_every"):
        _at_least(f"optim.{key}", getattr(o, key), 1)
    for key in ("warmup_epochs", "weight_decay", "grad_clip"):
        _at_least(f"optim.{key}", getattr(o, key), 0)
    _one_of("optim.precision", o.precision, PRECISIONS)
    if not (o.lr > 0 and math.isfinite(o.lr)):
        raise ValueError(f"config key 'optim.lr' must be a positive number, got {o.lr!r}")
    if o.cuda_graphs:
        _check_cuda_graphs(config)


# Device strings accepted without asking torch, which would have to be imported.
_COMMON_DEVICE = re.compile(r"auto|(cpu|cuda|mps)(:(0|[1-9]\d*))?")


def _check_device(name: str) -> None:
    if _COMMON_DEVICE.fullmatch(name):
        return
    import torch

    try:
        torch.device(name)
    except RuntimeError as error:
        raise ValueError(
            f"config key 'device' must be 'auto' or a torch device such as 'cpu', got {reprlib.repr(name)}"
        ) from (error)


def _check_graph_strategy(config: Config) -> None:
    """What ``strategy: graph`` runs: node level, GPS with MPNNs and attention that work on a partition."""
    m = config.model
    if config.task.level not in (None, "node"):
        raise ValueError(
            "distributed.strategy 'graph' partitions the nodes of one graph (task.level: node), got "
            f"task.level {config.task.level!r}; use strategy 'ddp' for many graphs"
        )
    if m.kind != "gps":
        raise ValueError(f"distributed.strategy 'graph' trains GPS models (model.kind: gps), got {m.kind!r}")
    _one_of("model.local (with distributed.strategy 'graph')", m.local, partitioned_local_kinds())
    _one_of("model.attention.kind (with distributed.strategy 'graph')", m.attention.kind,
            partitioned_attention_kinds())
    if config.log_branches:
        raise ValueError("config key 'log_branches' is not supported with distributed.strategy 'graph' yet")
    if m.norm == "graph":
        raise ValueError("model.norm 'graph' normalises each graph as a whole, which distributed.strategy "
                         "'graph' splits across the ranks; use 'layer' or 'batch'")


def _check_distributed(config: Config) -> None:
    strategy = config.distributed.strategy
    _one_of("distributed.strategy", strategy, STRATEGIES)
    _one_of("distributed.partition", config.distributed.partition, PARTITIONS)
    if strategy == "ddp" and config.task.level not in (None, "graph"):
        raise ValueError(
            "distributed.strategy 'ddp' splits mini-batches of many graphs (task.level: graph), got "
            f"task.level {config.task.level!r}"
        )
    if strategy == "graph":
        _check_graph_strategy(config)
    if config.optim.compile and strategy != "none":
        raise ValueError(f"config key 'optim.compile' needs distributed.strategy 'none', got {strategy!r}")
    if config.data.on_device and config.task.level not in (None, "graph"):
        raise ValueError(f"config key 'data.on_device' needs task.level 'graph', got {config.task.level!r}")
    if config.data.pad_to:
        _check_padding(config)


def _check_padding(config: Config) -> None:
    """``data.pad_to``: its three sizes, on graph-level GPS runs in one process."""
    PadBudget.from_config(config.data.pad_to)
    if config.task.level not in (None, "graph"):
        raise ValueError(f"config key 'data.pad_to' needs task.level 'graph', got {config.task.level!r}")
    if config.model.kind != "gps":
        raise ValueError(f"config key 'data.pad_to' needs model.kind 'gps', got {config.model.kind!r}")
    if config.distributed.strategy != "none":
        raise ValueError(f"config key 'data.pad_to' needs distributed.strategy 'none', got "
                         f"{config.distributed.strategy!r}")


def _check_cuda_graphs(config: Config) -> None:
    """``optim.cuda_graphs``: a compiled model, one batch shape, a device that may be CUDA."""
    if not config.optim.compile:
        raise ValueError("config key 'optim.cuda_graphs' captures the compiled model: it needs "
                         "'optim.compile: true'")
    if not config.data.pad_to:
        raise ValueError("config key 'optim.cuda_graphs' needs 'data.pad_to' (every batch one shape: a CUDA "
                         "graph is captured per shape)")
    if config.device.split(":")[0] not in ("cuda", "auto"):
        raise ValueError(f"config key 'optim.cuda_graphs' needs a CUDA device, got device {config.device!r}")


def validate_config(config: Config) -> None:
    """ValueError naming the first key whose value is out of range or not a known name.

    Cheap: imports no torch (unless ``device`` names an unusual device), reads no data, writes nothing.
    """
    _check_data(config)
    _check_task(config)
    _fraction("task.label_inputs", config.task.label_inputs, closed=False)
    _check_model(config)
    _check_optim(config)
    _check_distributed(config)
    _at_least("threads", config.threads, 1, optional=True)
    _one_of("allocator", config.allocator, ALLOCATORS)
    if config.tensorboard:
        require_tensorboard()
    _check_device(config.device)
    if not config.out_dir:
        raise ValueError("config key 'out_dir' must name a directory, got ''")
