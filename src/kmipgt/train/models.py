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


def _parameters(*callables: Any) -> list[str]:
    return [name for c in callables for name in inspect.signature(c).parameters]


_FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]
# Model keys named as the model classes' arguments: those GraphTransformer and BaselineModel both take,
# and those only GPS takes (the model's own and its layers'); a baseline's own keys come from KIND_ARGUMENTS.
_SHARED_MODEL_KEYS = (
    "kind",
    *(
        name for name in _parameters(GraphTransformer)
        if name in _FIELDS and name in _parameters(BaselineModel)
    ),
)
_GPS_MODEL_KEYS = tuple(
    dict.fromkeys(
        name for name in _parameters(GraphTransformer, GPSLayer)
        if name in _FIELDS and name not in _SHARED_MODEL_KEYS
    )
)
# GPS keys that reach the model as the attention core's attn_kwargs (ModelConfig.attn_kwargs).
_GPS_ATTENTION_KEYS = ("k", "attention_options")
_CONFIG_KEY = {"options": "baseline_options"}  # BaselineModel argument -> ModelConfig key, where they differ


def _shared_arguments(config: Config, data: PreparedData) -> dict[str, Any]:
    """The model arguments every kind takes: sizes and task from the data, the shared model keys, PEs."""
    return {
        "in_channels": data.in_channels,
        "out_channels": data.out_channels,
        "task": data.level,
        "lappe_dim": config.data.lappe_dim,
        "rwse_dim": config.data.rwse_dim,
        "node_categories": data.node_categories,
        **{key: getattr(config.model, key) for key in _SHARED_MODEL_KEYS if key != "kind"},
    }


def _build_gps(config: Config, data: PreparedData) -> GraphTransformer:
    own = {key: getattr(config.model, key) for key in _GPS_MODEL_KEYS}
    return GraphTransformer(
        **_shared_arguments(config, data),
        edge_channels=data.edge_channels,
        edge_categories=data.edge_categories,
        attn_kwargs=config.model.attn_kwargs(),
        **own,
    )


def _build_baseline(config: Config, data: PreparedData) -> BaselineModel:
    m = config.model
    own = {name: getattr(m, _CONFIG_KEY.get(name, name)) for name in KIND_ARGUMENTS[m.kind]}
    return BaselineModel(m.kind, **_shared_arguments(config, data), **own)


# config ``model.kind`` -> builder of the model sized for the data
# The keys are MODEL_KINDS of kmipgt.train.choices.
MODEL_BUILDERS = {"gps": _build_gps, **dict.fromkeys(BASELINE_KINDS, _build_baseline)}


def _log_ignored_model_keys(model: ModelConfig) -> None:
    """One warning naming the model keys set away from their defaults that ``model.kind`` does not read."""
    if model.kind == "gps":
        own = (*_GPS_MODEL_KEYS, *_GPS_ATTENTION_KEYS)
    else:
        own = tuple(_CONFIG_KEY.get(name, name) for name in KIND_ARGUMENTS[model.kind])
    used, defaults = {*_SHARED_MODEL_KEYS, *own}, ModelConfig()
    ignored = [
        f.name
        for f in dataclasses.fields(model)
        if f.name not in used and getattr(model, f.name) != getattr(defaults, f.name)
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
