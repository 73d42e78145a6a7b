"""Time and peak memory of k-MIP attention against full attention as N grows.

The efficiency experiment of the k-MIP paper, with its measurement faults fixed: every point runs in a
fresh process (per-point peak memory), inputs are created on the device, all methods use the same dtype,
B graphs × H heads are supported, the median and range of several runs follow a warm-up, and a point
predicted (or found) to exceed the time or memory budget is recorded as skipped rather than crashing.
"""

from __future__ import annotations

import json
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from kmipgt.bench.isolation import run_isolated, time_calls
from kmipgt.bench.plotting import plot_scaling
from kmipgt.ops import SEARCH_BACKENDS, full_attention, kmip_attention

__all__ = ["METHODS", "PASSES", "AttentionBenchConfig", "geometric_grid", "run_attention_benchmark"]

METHODS = ("kmip", "full", "full-naive")
PASSES = ("forward", "forward+backward")


@dataclass
class AttentionBenchConfig:
    """What to measure. ``n_values`` are nodes per graph; each point holds ``graphs`` such graphs."""

    n_values: list[int]
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    backends: list[str] = field(default_factory=lambda: ["torch"])
    passes: list[str] = field(default_factory=lambda: list(PASSES))
    graphs: int = 1
    heads: int = 1
    dim: int = 32
    dim_v: int = 32
    k: int = 16
    repeats: int = 3
    warmup: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    time_budget: float = 120.0
    memory_budget_gb: float = 16.0
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ValueError(f"`methods` must be among {METHODS}, got {sorted(unknown)}")
        if set(self.passes) - set(PASSES):
            raise ValueError(f"`passes` must be among {PASSES}, got {self.passes}")
        if not self.n_values or min(self.n_values) < 1:
            raise ValueError(f"`n_values` must be positive node counts, got {self.n_values}")
        # Budget predictions extrapolate from the previous, smaller N of a series.
        self.n_values = sorted(self.n_values)
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("`repeats` must be >= 1 and `warmup` >= 0")
        unknown = set(self.backends) - set(SEARCH_BACKENDS)
        if unknown:
            raise ValueError(f"`backends` must be among {SEARCH_BACKENDS}, got {sorted(unknown)}")
        check_positive(self, ("graphs", "heads", "dim", "dim_v", "k", "time_budget", "memory_budget_gb"))


def check_positive(config: object, names: tuple[str, ...]) -> None:
    """ValueError naming the first of ``config``'s fields ``names`` that is not > 0."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise ValueError(f"`{name}` must be > 0, got {value}")


def geometric_grid(n_min: int, n_max: int, factor: float = 2.0) -> list[int]:
    """``n_min, n_min·factor, …`` up to ``n_max`` (inclusive), as integers."""
    if not 1 <= n_min <= n_max or factor <= 1:
        raise ValueError(f"need 1 <= n_min <= n_max and factor > 1, got {n_min}, {n_max}, {factor}")
    values, n = [], float(n_min)
    while round(n) <= n_max:
        values.append(round(n))
        n *= factor
    return values


def naive_attention(query, key, value, ptr, scale):
    """Materialised softmax attention per graph: the ``[H, n, n]`` score matrix is stored."""
    outputs = []
    for start, end in zip(ptr[:-1].tolist(), ptr[1:].tolist()):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        weights = torch.softmax(torch.matmul(q, k.transpose(1, 2)) * scale, dim=-1)
        outputs.append(torch.matmul(weights, v).transpose(0, 1))
    return torch.cat(outputs)


def measure_point(params: dict) -> dict:
    """One (method, pass, N) point; runs inside :func:`run_isolated`."""
    torch.manual_seed(params["seed"])
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    n, graphs, heads = params["n"], params["graphs"], params["heads"]
    backward = params["pass"] == "forward+backward"
    ptr = torch.arange(graphs + 1) * n
    shape = (n * graphs, heads)
    query, key = (torch.randn(*shape, params["dim"], device=device, dtype=dtype) for _ in range(2))
    value = torch.randn(*shape, params["dim_v"], device=device, dtype=dtype)
    for tensor in (query, key, value):
        tensor.requires_grad_(backward)
    scale = params["dim"] ** -0.5

    def attend():
        if params["method"] == "kmip":
            return kmip_attention(query, key, value, params["k"], ptr=ptr, backend=params["backend"])
        if params["method"] == "full":
            return full_attention(query, key, value, ptr=ptr)
        return naive_attention(query, key, value, ptr, scale)

    def run():
        if backward:
            attend().sum().backward()
            for tensor in (query, key, value):
                tensor.grad = None
        else:
            with torch.no_grad():
                attend()

    return time_calls(run, params["repeats"], params["warmup"], device)


def _series_name(record: dict) -> str:
    method = record["method"] + (f"[{record['backend']}]" if record["method"] == "kmip" else "")
    return f"{method} {record['pass']}"


def _predicted_over_budget(previous: dict | None, params: dict, config: AttentionBenchConfig) -> str | None:
    """Why the point would exceed a budget, extrapolating from the series' previous point."""
    n, graphs, heads = params["n"], config.graphs, config.heads
    memory_budget = config.memory_budget_gb * 2**30
    if previous is None:
        if params["method"] == "full-naive" and 3 * 4 * graphs * heads * n * n > memory_budget:
            return "predicted memory over budget (materialised score matrix)"
        return None
    if previous["status"] != "ok":
        return "a smaller N of this series was already over budget"
    growth = n / previous["n"]
    runs = config.repeats + config.warmup
    if previous["time_median"] * growth**2 * runs > config.time_budget:
        return f"predicted time over the {config.time_budget:.0f} s budget"
    memory_growth = growth**2 if params["method"] == "full-naive" else growth
    if previous["peak_memory_bytes"] * memory_growth > memory_budget:
        return f"predicted memory over the {config.memory_budget_gb:.0f} GB budget"
    return None


def _series(config: AttentionBenchConfig) -> list[dict]:
    series = []
    for method in config.methods:
        for backend in config.backends if method == "kmip" else [None]:
            series += [{"method": method, "backend": backend, "pass": p} for p in config.passes]
    return series


def machine_info(device: str) -> dict:
    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def run_attention_benchmark(config: AttentionBenchConfig, out_dir: Path) -> dict:
    """Measure every (method, pass, N) point; write ``attention.json`` and ``attention.png``."""
    shared = {key: value for key, value in asdict(config).items() if key not in ("n_values", "methods")}
    records = []
    todo = [(s, n) for s in _series(config) for n in config.n_values]
    previous: dict[str, dict] = {}
    for spec, n in tqdm(todo, desc="bench attention", unit="point"):
        params = {**shared, **spec, "n": n}
        record = {**spec, "n": n}
        name = _series_name(record)
        reason = _predicted_over_budget(previous.get(name), params, config)
        if reason:
            record |= {"status": "skipped", "reason": reason}
        else:
            timeout = max(60.0, 2 * config.time_budget)
            record |= run_isolated("kmipgt.bench.attention:measure_point", params, timeout)
        previous[name] = record
        records.append(record)
    result = {"config": asdict(config), "machine": machine_info(config.device), "points": records}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "attention.json").write_text(json.dumps(result, indent=2))
    plot_scaling(
        records,
        _series_name,
        [("time_median", "time (s, median)", 1.0), ("peak_memory_bytes", "peak memory (MiB)", 2**-20)],
        out_dir / "attention.png",
        f"attention, B={config.graphs} H={config.heads} d={config.dim} k={config.k} {config.dtype} "
        f"on {config.device}",
    )
    return result


def markdown_table(result: dict) -> str:
    """Time (median and range) and peak memory per N, one column per series."""
    names = sorted({_series_name(r) for r in result["points"]})
    by_key = {(_series_name(r), r["n"]): r for r in result["points"]}
    header = "| N | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    rows = []
    for n in sorted({r["n"] for r in result["points"]}):
        cells = []
        for name in names:
            record = by_key.get((name, n))
            if record is None:
                cells.append("")
            elif record["status"] != "ok":
                cells.append("skipped")
            else:
                cells.append(
                    f"{record['time_median']:.3g} s [{record['time_min']:.3g}–{record['time_max']:.3g}], "
                    f"{record['peak_memory_bytes'] / 2**20:.0f} MiB"
                )
        rows.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return header + "\n".join(rows)
