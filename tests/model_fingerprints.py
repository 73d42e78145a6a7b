"""Fingerprints of the model every shipped config and every shipped sweep cell builds.

A fingerprint is the model's parameter and buffer names with their shapes, a few statistics of each
initial value and one evaluation-mode forward on fixed input, all computed on the same fake data
description (sizes only: no dataset is loaded). ``tests/configs/test_model_fingerprints.py`` compares the
current code against ``tests/fixtures/model_fingerprints.json``, written by the code before a refactor::

    python tests/model_fingerprints.py --write

so a restructuring of the model, its layers or the config keys must build the same model.

The fixture is written on one machine and checked on any other, whose CPU takes other BLAS and vector
code paths. So names and shapes compare exactly, values within a tolerance:

- each floating initial value is summarised by its norm and its projections on two fixed ±1 directions
  (integers from a seeded generator, the same on every machine). Another CPU moves a value by an ulp
  (relative 6e-8); another initialisation moves these by a large fraction of the norm;
- the forward runs in float64 on the float32 initial values, so the arithmetic of another CPU moves it by
  ~1e-15 and cannot change which keys a k-MIP query selects (in float32, a perturbation of 1e-6 already
  flips selections of some shipped models and moves their output by 1e-2).
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from kmipgt.configs import config_path, list_configs
from kmipgt.sweep import cell_overrides, expand, load_sweep
from kmipgt.train.config import Config, load_config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.models import build_model

STORE = Path(__file__).parent / "fixtures" / "model_fingerprints.json"
# The fake data every model is built for: feature sizes, output size, two graphs of 12 nodes (one graph
# of 24 nodes below graph level).
IN_CHANNELS, EDGE_CHANNELS, OUT_CHANNELS, GRAPHS, NODES = 8, 3, 5, 2, 12
# Normwise relative tolerances: far above another CPU's rounding (an ulp of the float32 initial values,
# float64 arithmetic after them), far below any change of initialisation, layer or order of operations.
STATE_RTOL, FORWARD_RTOL = 1e-6, 1e-5
# For tensors that are all zeros (biases): the statistics of another CPU are then exactly zero too.
ATOL = 1e-12


def resolved_configs() -> dict[str, Config]:
    """Every shipped run config by name, and every cell of every shipped sweep as ``sweep/cell``."""
    configs = {name: load_config(config_path(name)) for name in list_configs("run")}
    for name in list_configs("sweep"):
        sweep = load_sweep(name, out="unused")
        for cell in expand(sweep):
            overrides = [o for o in cell_overrides(sweep, cell) if not o.startswith("out_dir=")]
            configs[f"{name}/{cell.name}"] = load_config(sweep.base, overrides)
    return configs


def fake_inputs(config: Config, generator: torch.Generator) -> tuple[PreparedData, dict[str, Any]]:
    """The data description a model is built for and the keyword inputs of its forward."""
    in_channels = max(IN_CHANNELS, 1 + max(config.model.encoder.coord_columns, default=0))
    n = GRAPHS * NODES
    edges = [torch.randint(0, NODES, (2, 30), generator=generator) + g * NODES for g in range(GRAPHS)]
    edges = torch.cat(edges, 1)
    inputs: dict[str, Any] = {
        "x": torch.randn(n, in_channels, generator=generator),
        "edge_index": edges,
        # Node- and edge-level models see one graph (some baselines take no batch of several).
        "batch": torch.arange(GRAPHS).repeat_interleave(NODES) if config.task.level == "graph" else None,
        "edge_attr": torch.randn(edges.shape[1], EDGE_CHANNELS, generator=generator),
    }
    if config.data.lappe_dim:
        inputs["lappe"] = torch.randn(n, config.data.lappe_dim, generator=generator)
    if config.data.rwse_dim:
        inputs["rwse"] = torch.rand(n, config.data.rwse_dim, generator=generator)
    if config.task.level == "edge":
        inputs["edge_label_index"] = torch.randint(0, n, (2, 10), generator=generator)
    data = PreparedData(config.task.level, None, None, in_channels, EDGE_CHANNELS, OUT_CHANNELS, "fake")
    return data, inputs


def build(config: Config) -> tuple[nn.Module, dict[str, Any]]:
    """The model ``config`` builds, initialised from seed 0, in evaluation mode, and its fake inputs."""
    data, inputs = fake_inputs(config, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    return build_model(config, data).eval(), inputs


def _directions(numel: int) -> Tensor:
    """``[2, numel]`` fixed unit directions of ±1 entries, from integers: the same on every machine."""
    signs = torch.randint(0, 2, (2, numel), generator=torch.Generator().manual_seed(numel)) * 2 - 1
    return signs.double() / numel**0.5


def value_statistics(value: Tensor) -> list[Any]:
    """A floating tensor's ``[norm, projection, projection]`` (float64); other tensors' exact digest."""
    if not value.is_floating_point():
        return ["exact", hashlib.sha256(value.detach().cpu().long().numpy().tobytes()).hexdigest()]
    flat = value.detach().cpu().double().flatten()
    return [float(flat.norm()), *(float(p) for p in _directions(flat.numel()) @ flat)]


def forward64(model: nn.Module, inputs: dict[str, Any]) -> list[float]:
    """The model's output on ``inputs``, computed in float64 on its float32 initial values, flattened."""
    model = model.double()
    inputs = {key: value.double() if isinstance(value, Tensor) and value.is_floating_point() else value
              for key, value in inputs.items()}
    default = torch.get_default_dtype()
    # PyG's SGFormer makes its ones with the default dtype.
    torch.set_default_dtype(torch.float64)
    try:
        with torch.no_grad():
            torch.manual_seed(1)
            out = model(**inputs)
    finally:
        torch.set_default_dtype(default)
    return out.flatten().tolist()


def fingerprint_model(model: nn.Module, inputs: dict[str, Any]) -> dict[str, Any]:
    """Names and shapes of the state, statistics of its values, and the float64 forward on ``inputs``."""
    state = model.state_dict()
    return {
        "layout": [[name, list(value.shape)] for name, value in state.items()],
        "state": [value_statistics(value) for value in state.values()],
        "forward": forward64(model, inputs),
    }


def fingerprint(config: Config) -> dict[str, Any]:
    """:func:`fingerprint_model` of the model ``config`` builds on the fake data."""
    return fingerprint_model(*build(config))


def fingerprints(configs: dict[str, Config] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`fingerprint` of each config by name (default: every :func:`resolved_configs` entry)."""
    torch.set_num_threads(1)
    configs = resolved_configs() if configs is None else configs
    return {name: fingerprint(config) for name, config in configs.items()}


def state_differences(stored: list[list[Any]], current: list[list[Any]]) -> list[int]:
    """Indices of the tensors whose statistics differ by more than another CPU's rounding can explain."""
    differ = []
    for i, (before, now) in enumerate(zip(stored, current, strict=True)):
        if before[0] == "exact" or now[0] == "exact":
            if before != now:
                differ.append(i)
        elif max(abs(b - n) for b, n in zip(before, now)) > STATE_RTOL * before[0] + ATOL:
            differ.append(i)
    return differ


def forward_differs(stored: list[float], current: list[float]) -> bool:
    """Whether two forwards differ by more than ``FORWARD_RTOL`` of the stored one's norm."""
    before, now = torch.tensor(stored, dtype=torch.float64), torch.tensor(current, dtype=torch.float64)
    return before.shape != now.shape or bool((now - before).norm() > FORWARD_RTOL * before.norm() + ATOL)


def _key(value: Any) -> str:
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def compact(prints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The stored form: each distinct layout, state and forward once, the models naming them by hash."""
    tables: dict[str, dict[str, Any]] = {"layout": {}, "state": {}, "forward": {}}
    models = {}
    for name, entry in prints.items():
        models[name] = {}
        for part, table in tables.items():
            key = _key(entry[part])
            table[key] = entry[part]
            models[name][part] = key
    return {**{f"{part}s": table for part, table in tables.items()}, "models": models}


def expanded(store: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The fingerprints by model name, from :func:`compact`'s form."""
    return {
        name: {part: store[f"{part}s"][key] for part, key in keys.items()}
        for name, keys in store["models"].items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {STORE}")
    args = parser.parse_args()
    prints = fingerprints()
    if args.write:
        STORE.write_text(json.dumps(compact(prints), indent=1, sort_keys=True) + "\n")
    print(f"{len(prints)} models")


if __name__ == "__main__":
    main()
