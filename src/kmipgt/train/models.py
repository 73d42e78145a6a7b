"""The model a config asks for, sized for its data: GPS or a PyG baseline, and the keys each kind reads."""

from __future__ import annotations

import dataclasses
import inspect
import logging
from typing import Any

import torch

from kmipgt.nn import GPSLayer, GraphTransformer
from kmipgt.nn.baselines import KIND_ARGUMENTS, BaselineModel
from kmipgt.nn.choices import BASELINE_KINDS
from kmipgt.train.config import Config, ModelConfig
from kmipgt.train.datasets import PreparedData

logger = logging.getLogger(__name__)

# The sections of the model config: the parts of the model they configure.
_SECTIONS = ("encoder", "attention")
# Model keys every kind reads, each named as the model's argument it sets.
_SHARED_KEYS = ("kind", "channels", "num_layers", "dropout", "pooling", "head_layers")
# The GPS layers' own keys: GPSLayer's arguments that are model keys (the attention has its section).
_LAYER_KEYS = tuple(
    name for name in inspect.signature(GPSLayer).parameters
    if name in {f.name for f in dataclasses.fields(ModelConfig)} and name not in (*_SHARED_KEYS, *_SECTIONS)
)
# The encoder keys a baseline reads (it has no attention, and its NodeEncoder sums its inputs).
_BASELINE_ENCODER_KEYS = ("coord_columns", "num_frequencies")
_CONFIG_KEY = {"options": "baseline_options"}  # BaselineModel argument -> ModelConfig key, where they differ


def _encoder(config: Config, data: PreparedData, keys: tuple[str, ...]) -> dict[str, Any]:
    """The NodeEncoder's keyword arguments: ``keys`` of ``model.encoder``, the encodings' sizes and which
    features are category ids."""
    return {
        **{key: getattr(config.model.encoder, key) for key in keys},
        "lappe_dim": config.data.lappe_dim,
        "rwse_dim": config.data.rwse_dim,
        "categories": data.node_categories,
    }


def _shared_arguments(config: Config, data: PreparedData) -> dict[str, Any]:
    """The model arguments every kind takes: sizes and task from the data, the shared model keys."""
    m = config.model
    return {
        "in_channels": data.in_channels,
        "channels": m.channels,
        "out_channels": data.out_channels,
        "num_layers": m.num_layers,
        "task": data.level,
        "dropout": m.dropout,
        "pooling": m.pooling,
        "head_layers": m.head_layers,
    }


def _build_gps(config: Config, data: PreparedData) -> GraphTransformer:
    m = config.model
    return GraphTransformer(
        **_shared_arguments(config, data),
        edge_channels=data.edge_channels,
        edge_categories=data.edge_categories,
        encoder=_encoder(config, data, tuple(f.name for f in dataclasses.fields(m.encoder))),
        attention=m.attention.kind,
        attn_kwargs=m.attention.attn_kwargs(),
        **{key: getattr(m, key) for key in _LAYER_KEYS},
    )


def _build_baseline(config: Config, data: PreparedData) -> BaselineModel:
    m = config.model
    own = {name: getattr(m, _CONFIG_KEY.get(name, name)) for name in KIND_ARGUMENTS[m.kind]}
    encoder = _encoder(config, data, _BASELINE_ENCODER_KEYS)
    return BaselineModel(m.kind, **_shared_arguments(config, data), encoder=encoder, **own)


# config ``model.kind`` -> builder of the model sized for the data
# The keys are MODEL_KINDS of kmipgt.train.choices.
MODEL_BUILDERS = {"gps": _build_gps, **dict.fromkeys(BASELINE_KINDS, _build_baseline)}


def _dotted(section: Any, prefix: str = "") -> dict[str, Any]:
    """The keys of a model config and of its sections by dotted name (``attention.k``)."""
    flat = {}
    for key, value in vars(section).items():
        nested = dataclasses.is_dataclass(value)
        flat.update(_dotted(value, f"{prefix}{key}.") if nested else {prefix + key: value})
    return flat


def _read_keys(kind: str) -> set[str]:
    """The dotted model keys that ``kind``'s builder reads."""
    if kind == "gps":
        return {*_SHARED_KEYS, *_LAYER_KEYS, *(f"{section}." for section in _SECTIONS)}
    own = {_CONFIG_KEY.get(name, name) for name in KIND_ARGUMENTS[kind]}
    return {*_SHARED_KEYS, *own, *(f"encoder.{key}" for key in _BASELINE_ENCODER_KEYS)}


def _log_ignored_model_keys(model: ModelConfig) -> None:
    """One warning naming the model keys set away from their defaults that ``model.kind`` does not read."""
    read, defaults = _read_keys(model.kind), _dotted(ModelConfig())
    ignored = [
        key for key, value in _dotted(model).items()
        if value != defaults[key] and key not in read and f"{key.split('.')[0]}." not in read
    ]
    if ignored:
        logger.warning("model.kind=%s ignores these model keys: %s", model.kind, ", ".join(ignored))


def build_model(config: Config, data: PreparedData) -> torch.nn.Module:
    """The model of ``config.model.kind`` (:data:`MODEL_BUILDERS`) sized for ``data``."""
    kind = config.model.kind
    if kind not in MODEL_BUILDERS:
        raise ValueError(f"model.kind must be one of {tuple(MODEL_BUILDERS)}, got {kind!r}")
    _log_ignored_model_keys(config.model)
    return MODEL_BUILDERS[kind](config, data)
