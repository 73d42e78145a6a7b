"""The sweep file: a base config, fixed overrides and a grid of dotted keys, expanded into cells.

A sweep file (YAML) names a base config, fixed overrides and a grid of dotted keys; paths in it are relative
to the working directory, like ``kmipgt train --config``::

    base: configs/synthetic_city.yaml
    set: {optim.epochs: 60}
    grid:
      model.attention: [kmip, none]
      seed: [0, 1, 2]
    out: runs/sweeps/city_attention      # default: runs/sweeps/<sweep file stem>

Keys that must change together (attention off *and* the width that matches the parameter count) go into
named ``variants``, a first grid axis called ``variant``::

    variants:
      kmip: {}
      none_same_size: {model.attention: none, model.channels: 92}
    grid:
      seed: [0, 1, 2]

The replicate axes are ``seed`` (training seed), ``data.split_seed`` (a redrawn node-level split) and
``data.split_index`` (one of the splits a dataset ships): a summary averages over them, and a pair of
variants shares their values.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kmipgt.configs import config_path
from kmipgt.train.config_reading import parse_override, read_yaml

SWEEP_KEYS = ("base", "set", "variants", "grid", "out")
VARIANT_AXIS = "variant"
# Repeats of one experiment, not conditions to compare: training seeds, redrawn splits, a dataset's splits.
REPLICATE_AXES = ("seed", "data.split_seed", "data.split_index")
_MAX_NAME = 150  # cell directory names stay well below the usual 255-byte file-name limit


def format_value(value: Any) -> str:
    """``value`` as ``--set`` reads it back (YAML flow style): ``kmip``, ``1.0e-05``, ``[0, 1]``, ``null``."""
    return yaml.safe_dump(value, default_flow_style=True, width=math.inf).removesuffix("\n...\n").strip()


def condition_axes(axes: Sequence[str]) -> list[str]:
    """The axes that are conditions to compare: all but :data:`REPLICATE_AXES`, in order."""
    return [key for key in axes if key not in REPLICATE_AXES]


def replicate_axes(axes: Sequence[str]) -> list[str]:
    """The axes of :data:`REPLICATE_AXES` among ``axes``, in their order."""
    return [key for key in axes if key in REPLICATE_AXES]


@dataclass
class Sweep:
    """A parsed sweep file: base config, fixed overrides, the grid (dotted key -> values), the output and
    the named variants (name -> overrides that go together)."""

    path: Path
    base: Path
    fixed: dict[str, Any]
    grid: dict[str, list[Any]]
    out: Path
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)

    def axes(self) -> dict[str, list[Any]]:
        """The axes cells combine, in order: ``variant`` (the variants' names) first if there are any, then
        the grid's keys."""
        return {VARIANT_AXIS: list(self.variants), **self.grid} if self.variants else dict(self.grid)

    def group_keys(self) -> list[str]:
        """The axes a summary groups cells by: every one but the replicate axes (:data:`REPLICATE_AXES`)."""
        return condition_axes(self.axes())


@dataclass
class Cell:
    """One combination of grid values, with its directory name and its display label."""

    values: dict[str, Any]
    name: str
    label: str


def _mapping(value: Any, what: str) -> dict:
    if not isinstance(value, dict) or not all(isinstance(key, str) for key in value):
        raise ValueError(f"{what} must be a mapping of dotted config keys, got {reprlib.repr(value)}")
    if "out_dir" in value:
        raise ValueError(f"{what} must not set out_dir: each cell runs in OUT/cells/<cell name>")
    return value


def load_sweep(path: str | Path, out: str | Path | None = None, overrides: Sequence[str] = ()) -> Sweep:
    """Read and check a sweep file; ``out`` (e.g. from ``--out``) replaces the file's ``out``, and
    ``overrides`` (``"optim.epochs=20"``, from ``--set``) join or replace its ``set``.

    ``path`` and the file's ``base`` may name shipped configs (``sweeps/influence_of_k``, ``minnesota``).
    """
    path = config_path(path)
    with open(path) as f:
        content = read_yaml(f, str(path)) or {}
    if not isinstance(content, dict):
        raise ValueError(f"sweep {path} must be a mapping of {list(SWEEP_KEYS)}, got {reprlib.repr(content)}")
    unknown = sorted(set(content) - set(SWEEP_KEYS))
    if unknown:
        raise ValueError(f"unknown sweep keys {reprlib.repr(unknown)}; known: {list(SWEEP_KEYS)}")
    if "base" not in content:
        raise ValueError(f"sweep {path} needs a base config ('base: configs/....yaml')")
    command_line = _mapping(dict(map(parse_override, overrides)), "--set")
    fixed = {**_mapping(content.get("set") or {}, "set"), **command_line}
    grid = _mapping(content.get("grid") or {}, "grid")
    for key, values in grid.items():
        if not isinstance(values, list) or not values:
            raise ValueError(f"grid key {key!r} needs a non-empty list of values, got {reprlib.repr(values)}")
    both = sorted(set(fixed) & set(grid))
    if both:
        raise ValueError(f"keys both fixed by 'set' (or --set) and varied by 'grid': {both}")
    variants = _variants(content.get("variants"), fixed, grid)
    out = Path(out or content.get("out") or Path("runs/sweeps") / path.stem)
    return Sweep(path, config_path(content["base"]), fixed, grid, out, variants)


def _variants(content: Any, fixed: dict[str, Any], grid: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """The ``variants`` mapping, checked: names to overrides that neither ``set`` nor ``grid`` also sets."""
    if content is None:
        return {}
    if not isinstance(content, dict) or not content or not all(isinstance(name, str) for name in content):
        raise ValueError("variants must be a non-empty mapping of names to overrides, got "
                         f"{reprlib.repr(content)}")
    if VARIANT_AXIS in grid:
        raise ValueError(f"grid key {VARIANT_AXIS!r} is the axis of 'variants'; name the config key in full")
    variants = {name: _mapping(overrides or {}, f"variant {name!r}") for name, overrides in content.items()}
    for name, overrides in variants.items():
        clash = sorted(set(overrides) & (set(fixed) | set(grid)))
        if clash:
            raise ValueError(f"variant {name!r} sets keys that 'set' (or --set) or 'grid' also set: {clash}")
    return variants


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_") or "_"


def _cell_name(values: dict[str, Any]) -> str:
    """``key=value`` parts joined by ``__``, every run of other characters than ``A-Za-z0-9.+-`` -> ``_``."""
    text = "__".join(f"{key}={format_value(value)}" for key, value in values.items()) or "base"
    name = "__".join(f"{_safe(key)}={_safe(format_value(value))}" for key, value in values.items()) or "base"
    if len(name) > _MAX_NAME:  # keep it readable and unique: a prefix plus a hash of the whole
        name = f"{name[:_MAX_NAME - 9]}_{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    return name


def expand(sweep: Sweep) -> list[Cell]:
    """The cartesian product of the axes in file order (the variants first; the last key varies fastest)."""
    cells = []
    axes = sweep.axes()
    for combination in itertools.product(*axes.values()):
        values = dict(zip(axes, combination, strict=True))
        label = " ".join(f"{key}={format_value(value)}" for key, value in values.items()) or "base"
        cells.append(Cell(values, _cell_name(values), label))
    names = [cell.name for cell in cells]
    clashes = sorted({name for name in names if names.count(name) > 1})
    if clashes:
        raise ValueError(f"grid values give the same cell directory name: {clashes}")
    return cells


def cell_dir(sweep: Sweep, cell: Cell) -> Path:
    """Where ``cell`` trains: ``OUT/cells/<cell name>``."""
    return sweep.out / "cells" / cell.name


def cell_overrides(sweep: Sweep, cell: Cell) -> list[str]:
    """The ``key=value`` overrides of one cell: the fixed ones, its variant's, its grid values and its
    ``out_dir``."""
    grid_values = {key: value for key, value in cell.values.items() if key != VARIANT_AXIS}
    variant = sweep.variants[cell.values[VARIANT_AXIS]] if sweep.variants else {}
    values = {**sweep.fixed, **variant, **grid_values, "out_dir": str(cell_dir(sweep, cell))}
    return [f"{key}={format_value(value)}" for key, value in values.items()]
