"""Run configuration: nested dataclasses read from YAML, with ``key.sub=value`` overrides."""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml


@dataclass
class DataConfig:
    """Which dataset and how to prepare it.

    ``name`` picks a loader in :mod:`kmipgt.data` (see :data:`kmipgt.train.datasets.LOADERS`);
    ``options`` are passed to it as keyword arguments (e.g. ``root``, ``num_nodes``, ``seed``).
    ``val_edges``/``test_edges``: shares of edges held out for edge-level (link) tasks.
    """

    name: str = "minnesota"
    options: dict[str, Any] = field(default_factory=dict)
    lappe_dim: int = 0
    rwse_dim: int = 0
    batch_size: int = 32
    normalize_features: bool = True
    val_edges: float = 0.1
    test_edges: float = 0.1


@dataclass
class TaskConfig:
    """What is predicted and how it is scored.

    ``level``: ``node`` (one graph with train/val/test masks, full batch), ``graph`` (many graphs,
    mini-batches) or ``edge`` (link prediction on one graph: held-out edges against sampled non-edges,
    full batch, fresh negatives every epoch; use ``loss: bce``).
    ``loss``: ``cross_entropy``, ``bce`` (multi-label) or ``l1``. ``metric``:
    ``accuracy``, ``macro_f1``, ``ap`` or ``mae``; the best checkpoint is chosen on it.
    ``label_inputs`` (node-level classification): the training labels become inputs, one-hot columns
    plus a "label shown" column appended to the node features. Each training step shows the labels of
    this share of the training nodes, drawn afresh, and computes the loss on the others, so no node
    predicts a label it is shown; evaluation shows every training label. 0 (default): off.
    """

    level: str = "node"
    loss: str = "cross_entropy"
    metric: str = "accuracy"
    label_inputs: float = 0.0


@dataclass
class ModelConfig:
    """Which model and its arguments (sizes inferred from the data are left out).

    ``kind``: ``gps`` (:class:`kmipgt.nn.GraphTransformer`) or a PyG baseline of
    :class:`kmipgt.nn.BaselineModel` (``mlp``, ``gcn``, ``sage``, ``gat``, ``sgformer``, ``polynormer``).
    ``channels``, ``num_layers``, ``dropout``, encoder and head keys mean the same for every kind; ``local``,
    ``attention``, ``heads``, ``k``, ``head_dim``, ``attn_dropout``, ``attention_options`` and the
    ``attention_qk`` / ``attention_gate`` / ``attention_layers`` options (what queries and keys see, a
    zero-initialised gate on the attention branch, which layers have attention), ``branch_residual`` and
    ``ffn`` (the GPS layer's residuals and feed-forward block) and ``checkpoint`` (activation
    checkpointing per layer, to train larger graphs in less memory) are GPS-only;
    ``residual`` and ``baseline_options`` (keyword arguments of the PyG model) are for baselines.
    ``attention_options`` are the attention core's ``attn_kwargs`` (:meth:`attn_kwargs`).
    """

    kind: str = "gps"
    channels: int = 64
    num_layers: int = 4
    local: str = "gatedgcn"
    attention: str = "kmip"
    heads: int = 4
    k: int = 16
    head_dim: int | None = None
    dropout: float = 0.0
    attn_dropout: float = 0.0
    norm: str = "layer"
    activation: str = "gelu"
    pooling: str = "mean"
    head_layers: int = 2
    coord_columns: list[int] = field(default_factory=list)
    num_frequencies: int = 0
    attention_options: dict[str, Any] = field(default_factory=dict)
    attention_qk: str = "hidden"
    attention_gate: bool = False
    attention_layers: list[int] | None = None
    branch_residual: bool = True
    ffn: bool = True
    checkpoint: bool = False
    residual: bool = False
    baseline_options: dict[str, Any] = field(default_factory=dict)

    def attn_kwargs(self) -> dict[str, Any]:
        """The options of the attention kind's core: ``attention_options``, plus ``k`` for ``kmip``.

        ``k`` stays a top-level key so that configs written before ``attention_options`` carried the
        kind-specific options read unchanged; other kinds take no ``k`` and do not get it.
        """
        if self.attention == "kmip":
            return {"k": self.k, **self.attention_options}
        return dict(self.attention_options)


@dataclass
class OptimConfig:
    """AdamW with linear warm-up then cosine decay to zero, and gradient-norm clipping.

    ``precision``: ``fp32``, or ``bf16`` (the forward pass under bfloat16 autocast on CPU or GPU, with fp32
    weights, optimiser state and loss: about half the activation memory).
    """

    lr: float = 1e-3
    weight_decay: float = 0.0
    epochs: int = 100
    warmup_epochs: int = 5
    grad_clip: float = 1.0
    eval_every: int = 1
    precision: str = "fp32"


@dataclass
class Config:
    """A whole run: data, task, model, optimiser, seed, device, CPU threads and output directory.

    ``threads`` sets torch's intra-op CPU threads (``None``: torch's default, one per core).
    ``log_branches``: log each GPS layer's branch output scale and gradient norm per epoch
    (:mod:`kmipgt.train.branches`).
    ``tensorboard``: also write each epoch's ``log.csv`` values as TensorBoard scalars to
    ``out_dir/tensorboard/`` (extra ``kmipgt[tensorboard]``; :mod:`kmipgt.train.tensorboard`).
    """

    data: DataConfig = field(default_factory=DataConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    seed: int = 0
    device: str = "auto"
    threads: int | None = None
    log_branches: bool = False
    tensorboard: bool = False
    out_dir: str = "runs/default"


def _coerce(value: Any, annotation: Any, name: str) -> Any:
    """Check ``value`` against a field annotation (int -> float allowed) and convert nested dataclasses."""
    if dataclasses.is_dataclass(annotation):
        return _from_dict(annotation, value, f"{name}.")
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(annotation)
        if value is None and type(None) in options:
            return None
        return _coerce(value, next(a for a in options if a is not type(None)), name)
    if annotation is typing.Any:
        return value
    expected = origin or annotation
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise TypeError(f"config key {name!r} expects {annotation}, got {value!r}")
    return value


def _from_dict(cls: type, values: Any, prefix: str = "") -> Any:
    if not isinstance(values, dict):
        raise TypeError(
            f"config section {prefix.rstrip('.') or '<root>'!r} must be a mapping, got {values!r}"
        )
    fields = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ValueError(
            f"unknown config keys in {prefix.rstrip('.') or '<root>'!r}: {unknown}; known: {sorted(fields)}"
        )
    kwargs = {key: _coerce(value, fields[key], f"{prefix}{key}") for key, value in values.items()}
    return cls(**kwargs)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = tree
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ValueError(f"override {dotted!r}: {part!r} is not a section")
    node[leaf] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"model.k=32"`` -> ``("model.k", 32)``; the value is read as YAML (numbers, lists, null, ...)."""
    key, sep, raw = text.partition("=")
    if not sep or not key:
        raise ValueError(f"override must look like key.sub=value, got {text!r}")
    return key.strip(), yaml.safe_load(raw)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> Config:
    """Read a YAML config (or start from defaults) and apply ``key.sub=value`` overrides.

    Unknown keys and values of the wrong type raise, so a typo never silently keeps a default.
    """
    tree: dict = {}
    if path is not None:
        with open(path) as f:
            try:
                tree = yaml.safe_load(f) or {}
            except yaml.YAMLError as error:
                problem = " ".join(str(error).split())
                raise ValueError(f"{path} is not valid YAML: {problem}") from error
    for text in overrides:
        _set_dotted(tree, *parse_override(text))
    return _from_dict(Config, tree)


def config_to_dict(config: Config) -> dict:
    """Plain nested dict, suitable for ``yaml.safe_dump``."""
    return dataclasses.asdict(config)


def _flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key != "options" and not key.endswith("_options"):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _with_defaults(tree: dict) -> dict:
    """A :func:`config_to_dict` tree with every key it lacks set to its default."""
    return config_to_dict(_from_dict(Config, tree))


def config_differences(saved: dict, current: dict) -> list[str]:
    """Dotted keys whose values differ between two :func:`config_to_dict` trees.

    ``out_dir`` is compared as a resolved path: ``runs/x`` and ``./runs/x/`` are the same run. Keys that
    ``saved`` lacks (it was written before they existed) count as their defaults, which reproduce what
    the run did then.
    """
    saved, current = _flatten(_with_defaults(saved)), _flatten(current)
    for flat in (saved, current):
        if flat.get("out_dir") is not None:
            flat["out_dir"] = Path(flat["out_dir"]).resolve()
    return sorted(
        key for key in saved.keys() | current.keys() if saved.get(key, ...) != current.get(key, ...)
    )
