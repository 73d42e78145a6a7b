"""Fingerprints of the model every shipped config and every shipped sweep cell builds.

A fingerprint is the model's parameter and buffer names with their shapes, a hash of their initial values
and a hash of one evaluation-mode forward on fixed input, all computed on the same fake data description
(sizes only: no dataset is loaded). ``tests/configs/test_model_fingerprints.py`` compares the current code
against ``tests/fixtures/model_fingerprints.json``, written by the code before a refactor::

    python tests/model_fingerprints.py --write

so a restructuring of the model, its layers or the config keys must build the same model, bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from kmipgt.configs import config_path, list_configs
from kmipgt.sweep import cell_overrides, expand, load_sweep
from kmipgt.train.config import Config, load_config
from kmipgt.train.datasets import PreparedData
from kmipgt.train.models import build_model

STORE = Path(__file__).parent / "fixtures" / "model_fingerprints.json"
# The fake data every model is built for: feature sizes, output size, two graphs of 12 nodes (one graph
# of 24 nodes below graph level).
IN_CHANNELS, EDGE_CHANNELS, OUT_CHANNELS, GRAPHS, NODES = 8, 3, 5, 2, 12


def resolved_configs() -> dict[str, Config]:
    """Every shipped run config by name, and every cell of every shipped sweep as ``sweep/cell``."""
    configs = {name: load_config(config_path(name)) for name in list_configs("run")}
    for name in list_configs("sweep"):
        sweep = load_sweep(name, out="unused")
        for cell in expand(sweep):
            overrides = [o for o in cell_overrides(sweep, cell) if not o.startswith("out_dir=")]
            configs[f"{name}/{cell.name}"] = load_config(sweep.base, overrides)
    return configs


def _fake_inputs(config: Config, generator: torch.Generator) -> tuple[PreparedData, dict[str, Any]]:
    in_channels = max(IN_CHANNELS, 1 + max(config.model.coord_columns, default=0))
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


def _digest(tensors: list[torch.Tensor]) -> str:
    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return sha.hexdigest()


def fingerprint(config: Config) -> dict[str, Any]:
    """Names and shapes of the state, a hash of its initial values and of one forward's output."""
    generator = torch.Generator().manual_seed(0)
    data, inputs = _fake_inputs(config, generator)
    torch.manual_seed(0)
    model = build_model(config, data).eval()
    state = model.state_dict()
    with torch.no_grad():
        torch.manual_seed(1)
        out = model(**inputs)
    return {
        "state": [[name, list(value.shape)] for name, value in state.items()],
        "values_sha256": _digest(list(state.values())),
        "forward_sha256": _digest([out]),
        "forward_sum": float(out.double().sum()),
    }


def fingerprints() -> dict[str, dict[str, Any]]:
    """:func:`fingerprint` of every :func:`resolved_configs` entry by name."""
    torch.set_num_threads(1)
    return {name: fingerprint(config) for name, config in resolved_configs().items()}


def compact(prints: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The stored form: each distinct state layout once, the models naming it by its hash."""
    layouts, models = {}, {}
    for name, entry in prints.items():
        key = hashlib.sha256(json.dumps(entry["state"]).encode()).hexdigest()[:16]
        layouts[key] = entry["state"]
        models[name] = {**{k: v for k, v in entry.items() if k != "state"}, "state": key}
    return {"layouts": layouts, "models": models}


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
