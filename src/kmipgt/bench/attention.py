"""Time and peak memory of k-MIP attention against full attention as N grows.

The efficiency experiment of the k-MIP paper, with its measurement faults fixed: every point runs in a
fresh process (per-point peak memory), inputs are created on the device, all methods use the same dtype,
B graphs × H heads are supported, the median and range of several runs follow a warm-up, and a point
predicted (or found) to exceed the time or memory budget is recorded as skipped rather than crashing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from kmipgt.bench import common
from kmipgt.bench.isolation import time_calls
from kmipgt.ops import SEARCH_BACKENDS, full_attention, kmip_attention

__all__ = ["METHODS", "PASSES", "AttentionBenchConfig", "run_attention_benchmark"]

METHODS = ("kmip", "full", "full-naive")
PASSES = ("forward", "forward+backward")


@dataclass
class AttentionBenchConfig(common.PointBenchConfig):
    """What to measure. ``n_values`` are nodes per graph; each point holds ``graphs`` such graphs."""

    methods: list[str] = field(default_factory=lambda: list(METHODS), metadata={"help": "methods timed"})
    backends: list[str] = field(default_factory=lambda: ["auto"], metadata={"help": (
        "k-MIP search backends (default auto, the library's: fused on CPU, triton on CUDA, else torch)")})
    passes: list[str] = field(default_factory=lambda: list(PASSES), metadata={"help": "passes timed"})
    graphs: int = field(default=1, metadata={"help": "B graphs of N nodes each"})
    heads: int = field(default=1, metadata={"help": "attention heads"})
    dim: int = field(default=32, metadata={"help": "query/key head dimension d"})
    dim_v: int = field(default=32, metadata={"help": "value head dimension"})
    k: int = field(default=16, metadata={"help": "keys each query attends to"})

    def __post_init__(self) -> None:
        unknown = set(self.methods) - set(METHODS)
        if unknown:
            raise ValueError(f"`methods` must be among {METHODS}, got {sorted(unknown)}")
        if set(self.passes) - set(PASSES):
            raise ValueError(f"`passes` must be among {PASSES}, got {self.passes}")
        super().__post_init__()
        unknown = set(self.backends) - set(SEARCH_BACKENDS)
        if unknown:
            raise ValueError(f"`backends` must be among {SEARCH_BACKENDS}, got {sorted(unknown)}")
        common.check_positive(self, ("graphs", "heads", "dim", "dim_v", "k"))

    def over_budget(self, previous: dict | None, params: dict) -> str | None:
        """Why the point would exceed a budget; the naive method's memory grows as N², the others' as N."""
        naive = params["method"] == "full-naive"
        # A first point has nothing to extrapolate from, but the naive method's three float32 [B·H, N, N]
        # tensors (scores, scaled scores, weights) alone may not fit.
        scores_bytes = 3 * 4 * self.graphs * self.heads * params["n"] ** 2
        if previous is None and naive and scores_bytes > self.memory_budget_gb * 2**30:
            return "predicted memory over budget (materialised score matrix)"
        return common.predicted_over_budget(
            previous, params["n"], self, memory_exponent=2.0 if naive else 1.0
        )


def naive_attention(query, key, value, ptr, scale):
    """Materialised softmax attention per graph: the ``[H, n, n]`` score matrix is stored."""
    outputs = []
    for start, end in zip(ptr[:-1].tolist(), ptr[1:].tolist()):
        q, k, v = (t[start:end].transpose(0, 1) for t in (query, key, value))
        weights = torch.softmax(torch.matmul(q, k.transpose(1, 2)) * scale, dim=-1)
        outputs.append(torch.matmul(weights, v).transpose(0, 1))
    return torch.cat(outputs)


def measure_point(params: dict) -> dict:
    """One (method, pass, N) point; runs inside :func:`~kmipgt.bench.isolation.run_isolated`."""
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


def _series(config: AttentionBenchConfig) -> list[dict]:
    series = []
    for method in config.methods:
        for backend in config.backends if method == "kmip" else [None]:
            series += [{"method": method, "backend": backend, "pass": p} for p in config.passes]
    return series


def run_attention_benchmark(config: AttentionBenchConfig, out_dir: Path) -> dict:
    """Measure every (method, pass, N) point; write ``attention.json`` and ``attention.png``."""
    shared = {key: value for key, value in asdict(config).items() if key not in ("n_values", "methods")}
    result = common.run_budgeted(config, "attention", _series(config), shared, min_timeout=60.0)
    title = (
        f"attention, B={config.graphs} H={config.heads} d={config.dim} k={config.k} {config.dtype} "
        f"on {config.device}"
    )
    panels = [common.TIME_PANEL, common.MEMORY_PANEL]
    common.write_result(out_dir / "attention", result, result["points"], _series_name, panels, title)
    return result


def _cell(record: dict) -> str:
    if record["status"] != "ok":
        return "skipped"
    return (
        f"{record['time_median']:.3g} s [{record['time_min']:.3g}–{record['time_max']:.3g}], "
        f"{record['peak_memory_bytes'] / 2**20:.0f} MiB"
    )


def markdown_table(result: dict) -> str:
    """Time (median and range) and peak memory per N, one column per series."""
    names = sorted({_series_name(r) for r in result["points"]})
    return common.series_table(result["points"], names, _series_name, _cell)
