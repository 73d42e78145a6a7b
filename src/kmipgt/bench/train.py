"""Time per epoch and peak RSS of full-batch training vs N, one ``kmipgt train`` process per point.

Each point trains a config (by default ``synthetic_london``: GPS + k-MIP, checkpointing) on a synthetic
city of N nodes for ``epochs`` epochs, evaluating only after the last, so the first epoch's seconds are
one training step alone (forward, backward, optimiser). Peak RSS is the run's own (its ``metrics.json``).
Every point runs under the same heap policy, the config key ``allocator`` passed to it (default ``live``:
the resident set follows live memory at every N, where one config's own setting may suit only some N;
``docs/scaling.md``, "Allocator").
The ``kmipgt train`` command runs as a subprocess rather than an import: the benchmarks sit below the
trainer in the package layers, and a fresh process per point keeps the peaks apart.
"""

from __future__ import annotations

import csv
import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from kmipgt.bench.common import bench_result, write_result
from kmipgt.child import run_python_module
from kmipgt.data.city_networks import CITY_NUM_EDGES, CITY_NUM_NODES
from kmipgt.logs import quiet
from kmipgt.malloc import ALLOCATORS, check_allocator

__all__ = ["METHODS", "TrainBenchConfig", "fitted_slopes", "run_train_benchmark"]

# Attention kinds, each as the overrides that select it on top of the benchmarked config.
METHODS = {
    "none": ["model.attention=none"],
    "kmip_exact": ["model.attention=kmip", "model.attention.options={}"],
    "kmip_ivf": ["model.attention=kmip", "model.attention.options={backend: ivf, recall: 0.95}"],
    "grf": ["model.attention=grf", "model.attention.options={}"],
}
# Growth of the time per epoch with N assumed when predicting a point's cost: exact search is quadratic.
_TIME_EXPONENT = {"kmip_exact": 2.0}


@dataclass(kw_only=True)
class TrainBenchConfig:
    """What ``kmipgt bench train`` measures: ``methods`` at every N of ``n_values`` (sorted), each point's
    ``kmipgt train`` run under ``allocator`` (:mod:`kmipgt.malloc`), on cities as sparse as London's road
    graph by default."""

    n_values: list[int]
    edges_per_node: float = field(
        default=CITY_NUM_EDGES["london"] / CITY_NUM_NODES["london"],
        metadata={"help": "undirected roads per node (0: the generator's own)"},
    )
    methods: list[str] = field(
        default_factory=lambda: ["none", "kmip_ivf"],
        metadata={"help": f"comma-separated subset of {','.join(METHODS)}"},
    )
    config: str = field(default="synthetic_london", metadata={"help": "run config (path or shipped name)"})
    epochs: int = field(default=2, metadata={"help": "epochs per point; the first is timed"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads of every point"})
    time_budget: float = field(default=3600.0, metadata={"help": "seconds per point"})
    memory_budget_gb: float = field(default=16.0, metadata={"help": "peak RSS per point (GB)"})
    allocator: str = field(default="live", metadata={
        "help": "config key `allocator` of every point (heap policy, kmipgt.malloc)", "choices": ALLOCATORS})
    overrides: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.n_values or min(self.n_values) < 50:
            raise ValueError(f"`n_values` must be node counts >= 50, got {self.n_values}")
        self.n_values = sorted(self.n_values)
        unknown = sorted(set(self.methods) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown methods {unknown}; known: {', '.join(METHODS)}")
        if self.epochs < 1 or self.threads < 1 or self.time_budget <= 0 or self.memory_budget_gb <= 0:
            raise ValueError("`epochs`, `threads`, `time_budget` and `memory_budget_gb` must be positive")
        check_allocator(self.allocator)


def _over_budget(previous: dict | None, method: str, n: int, config: TrainBenchConfig) -> str | None:
    """Why the point would exceed a budget, extrapolated from the method's last point (memory linear)."""
    if previous is None:
        return None
    if previous["status"] != "ok":
        return "a smaller N of this method was not measured"
    growth = n / previous["n"]
    seconds = previous["seconds_total"] * growth ** _TIME_EXPONENT.get(method, 1.5)
    if seconds > config.time_budget:
        return f"predicted time {seconds:.0f} s, over the {config.time_budget:.0f} s budget"
    memory = previous["peak_memory_bytes"] * growth
    if memory > config.memory_budget_gb * 2**30:
        return f"predicted peak memory {memory / 2**30:.1f} GiB, over {config.memory_budget_gb:.0f} GB"
    return None


def _train_args(config: TrainBenchConfig, method: str, n: int, out_dir: Path) -> list[str]:
    edges = round(n * config.edges_per_node) if config.edges_per_node > 0 else None
    options = f"{{num_nodes: {n}, seed: 0" + (f", num_edges: {edges}}}" if edges else "}")
    settings = [
        f"data.options={options}", f"optim.epochs={config.epochs}", f"optim.eval_every={config.epochs}",
        f"threads={config.threads}", f"allocator={config.allocator}", f"out_dir={out_dir}", *METHODS[method],
        *config.overrides,
    ]
    command = ["train", "--config", config.config, "--overwrite"]
    return [*command, "--no-progress", *(part for setting in settings for part in ("--set", setting))]


def measure_point(config: TrainBenchConfig, method: str, n: int, work_dir: Path) -> dict:
    """Train ``method`` on ``n`` nodes in a ``kmipgt train`` process; its record (``status`` ok or failed)."""
    out_dir = work_dir / f"{method}_{n}"
    done = run_python_module("kmipgt", _train_args(config, method, n, out_dir), capture_output=True,
                             text=True, timeout=2 * config.time_budget)
    if done.returncode != 0:
        last_lines = done.stderr.strip().splitlines()[-1:]
        return {"status": "failed", "reason": last_lines[0] if last_lines else "(no output)"}
    with open(out_dir / "log.csv") as log:
        seconds = [float(row["seconds"]) for row in csv.DictReader(log)]
    metrics = json.loads((out_dir / "metrics.json").read_text())
    return {
        "status": "ok",
        "time_per_epoch": seconds[0],  # training only: the evaluation follows the last epoch
        "seconds_total": sum(seconds),
        "peak_memory_bytes": metrics["peak_memory_mb"] * 2**20,
    }


def fitted_slopes(records: list[dict], field_name: str) -> dict[str, float]:
    """Per method, the least-squares slope of log ``field_name`` against log N over its ok points."""
    slopes = {}
    for method in dict.fromkeys(r["method"] for r in records):
        points = [r for r in records if r["method"] == method and r["status"] == "ok"]
        if len(points) >= 2:
            x = np.log([p["n"] for p in points])
            y = np.log([p[field_name] for p in points])
            slopes[method] = round(float(np.polyfit(x, y, 1)[0]), 3)
    return slopes


def run_train_benchmark(config: TrainBenchConfig, out: Path) -> dict:
    """Every method at every N (skipping predicted over-budget points); writes ``train.json``/``.png``."""
    records, previous = [], {}
    todo = [(method, n) for method in config.methods for n in config.n_values]
    with tempfile.TemporaryDirectory(prefix="kmipgt-bench-train-") as work_dir:
        for method, n in tqdm(todo, desc="bench train", unit="point", disable=quiet()):
            reason = _over_budget(previous.get(method), method, n, config)
            record = {"method": method, "n": n}
            if reason:
                record |= {"status": "skipped", "reason": reason}
            else:
                record |= measure_point(config, method, n, Path(work_dir))
            previous[method] = record
            records.append(record)
    slopes = {"time_per_epoch": fitted_slopes(records, "time_per_epoch"),
              "peak_memory": fitted_slopes(records, "peak_memory_bytes")}
    result = bench_result(config, "cpu", points=records, slopes=slopes)
    panels = [("time_per_epoch", "training epoch (s)", 1.0), ("peak_memory_bytes", "peak RSS (MiB)", 2**-20)]
    title = f"kmipgt bench train ({config.config}); log-log slopes of time: " + ", ".join(
        f"{m} {s:.2f}" for m, s in slopes["time_per_epoch"].items()
    )
    write_result(out / "train", result, records, lambda r: r["method"], panels, title)
    return result
