"""What the benchmarks share: run options, size grid, budget prediction, point loop, result files.

A scaling benchmark measures series of points (one series per method or backend, one point per N), each
point in a fresh interpreter (:func:`kmipgt.bench.isolation.run_isolated`). The child side, running a
point and timing it, stays in :mod:`kmipgt.bench.isolation`: every child imports that module as its
entry point, so it must not pull in what only the parent needs here (tqdm, matplotlib).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from kmipgt.atomic import atomic_write_json
from kmipgt.bench.isolation import run_isolated
from kmipgt.bench.plotting import plot_scaling
from kmipgt.logs import quiet
from kmipgt.machine import machine_info

__all__ = [
    "DTYPES",
    "MEMORY_PANEL",
    "TIME_PANEL",
    "PointBenchConfig",
    "bench_result",
    "check_positive",
    "geometric_grid",
    "predicted_over_budget",
    "run_budgeted",
    "run_points",
    "series_table",
    "write_json",
    "write_result",
]

# Panels of :func:`~kmipgt.bench.plotting.plot_scaling`: (record field, axis label, factor).
TIME_PANEL = ("time_median", "time (s, median)", 1.0)
MEMORY_PANEL = ("peak_memory_bytes", "peak memory (MiB)", 2**-20)
DTYPES = ("float32", "float16", "bfloat16", "float64")


def check_positive(config: object, names: tuple[str, ...]) -> None:
    """ValueError naming the first of ``config``'s fields ``names`` that is not > 0."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not value > 0:
            raise ValueError(f"`{name}` must be > 0, got {value}")


@dataclass(kw_only=True)
class PointBenchConfig:
    """Sizes and run options of a benchmark whose points are budgeted; each field's ``help`` is its
    ``kmipgt bench`` flag's.

    ``n_values`` are sorted: budget predictions extrapolate from the previous, smaller N of a series.
    """

    n_values: list[int]
    repeats: int = field(default=3, metadata={"help": "timed runs per point (median and range reported)"})
    warmup: int = field(default=1, metadata={"help": "untimed runs per point first"})
    device: str = field(default="cpu", metadata={"help": "torch device"})
    dtype: str = field(default="float32", metadata={"help": "dtype of the inputs", "choices": DTYPES})
    time_budget: float = field(default=120.0, metadata={"help": "seconds per point, all runs"})
    memory_budget_gb: float = field(default=16.0, metadata={"help": "peak memory per point (GB)"})
    seed: int = field(default=0, metadata={"help": "seed of the inputs"})

    def __post_init__(self) -> None:
        if not self.n_values or min(self.n_values) < 1:
            raise ValueError(f"`n_values` must be positive node counts, got {self.n_values}")
        self.n_values = sorted(self.n_values)
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("`repeats` must be >= 1 and `warmup` >= 0")
        check_positive(self, ("time_budget", "memory_budget_gb"))

    def over_budget(self, previous: dict | None, params: dict) -> str | None:
        """Why the point of ``params`` would exceed the budgets, or None.

        :func:`predicted_over_budget` with time quadratic and memory linear in N; a benchmark whose
        costs grow otherwise overrides this.
        """
        return predicted_over_budget(previous, params["n"], self)


def geometric_grid(n_min: int, n_max: int, factor: float = 2.0) -> list[int]:
    """``n_min, n_min·factor, …`` up to ``n_max`` (inclusive), as integers."""
    if not 1 <= n_min <= n_max or factor <= 1:
        raise ValueError(f"need 1 <= n_min <= n_max and factor > 1, got {n_min}, {n_max}, {factor}")
    values, n = [], float(n_min)
    while round(n) <= n_max:
        values.append(round(n))
        n *= factor
    return values


def predicted_over_budget(
    previous: dict | None,
    n: int,
    config: PointBenchConfig,
    time_exponent: float = 2.0,
    memory_exponent: float = 1.0,
) -> str | None:
    """Why a point of ``n`` nodes would exceed ``config``'s budgets; None if it is expected to fit.

    Extrapolates from ``previous``, the series' last point (None: nothing to go on): its median time
    grows as ``(n / previous_n) ** time_exponent`` per run, its peak memory as ``** memory_exponent``.
    """
    if previous is None:
        return None
    if previous["status"] != "ok":
        return "a smaller N of this series was already over budget"
    growth = n / previous["n"]
    runs = config.repeats + config.warmup
    if previous["time_median"] * growth**time_exponent * runs > config.time_budget:
        return f"predicted time over the {config.time_budget:.0f} s budget"
    if previous["peak_memory_bytes"] * growth**memory_exponent > config.memory_budget_gb * 2**30:
        return f"predicted memory over the {config.memory_budget_gb:.0f} GB budget"
    return None


def run_points(
    todo: Sequence[tuple[dict, int]],
    shared: dict,
    target: str,
    timeout: float,
    *,
    desc: str,
    over_budget: Callable[[dict | None, dict], str | None] | None = None,
) -> list[dict]:
    """Measure each ``(spec, n)`` of ``todo`` with ``target`` in a fresh process; one record each.

    A record is ``spec``, ``n``, then what ``target`` (``"module:function"``) returned for the params
    ``{**shared, **spec, "n": n}``, or a ``"skipped"`` status where ``over_budget(previous, params)``
    gives a reason, ``previous`` being the last record of the same spec (None at first).
    """
    records: list[dict] = []
    previous: dict[tuple, dict] = {}
    for spec, n in tqdm(todo, desc=desc, unit="point", disable=quiet()):
        params = {**shared, **spec, "n": n}
        record = {**spec, "n": n}
        series = tuple(spec.items())
        reason = over_budget(previous.get(series), params) if over_budget else None
        if reason:
            record |= {"status": "skipped", "reason": reason}
        else:
            record |= run_isolated(target, params, timeout)
        previous[series] = record
        records.append(record)
    return records


def run_budgeted(
    config: PointBenchConfig, name: str, specs: Sequence[dict], shared: dict, min_timeout: float
) -> dict:
    """Every spec of ``specs`` at every N of ``config``: the result body, its records under ``"points"``.

    Each point runs ``kmipgt.bench.<name>:measure_point`` unless ``config.over_budget`` skips it. The
    time-out is twice the time budget, at least ``min_timeout`` seconds (interpreter start and imports).
    """
    records = run_points(
        [(spec, n) for spec in specs for n in config.n_values],
        shared,
        f"kmipgt.bench.{name}:measure_point",
        max(min_timeout, 2 * config.time_budget),
        desc=f"bench {name}",
        over_budget=config.over_budget,
    )
    return bench_result(config, config.device, points=records)


def bench_result(config: object, device: str, **parts: object) -> dict:
    """``{"config": asdict(config), "machine": machine_info(device), **parts}``: a result file's body."""
    return {"config": asdict(config), "machine": machine_info(device), **parts}


def write_json(result: dict, path: Path) -> None:
    """``result`` as indented JSON at ``path`` (its folder created)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, result)


def write_result(
    stem: Path,
    result: dict,
    records: Sequence[dict],
    series: Callable[[dict], str],
    panels: Sequence[tuple[str, str, float]],
    title: str,
) -> None:
    """``stem.json`` (the whole ``result``) and ``stem.png`` (:func:`plot_scaling` of ``records``)."""
    write_json(result, stem.with_suffix(".json"))
    plot_scaling(records, series, panels, stem.with_suffix(".png"), title)


def series_table(
    points: Sequence[dict], names: Sequence[str], series: Callable[[dict], str], cell: Callable[[dict], str]
) -> str:
    """Markdown table of ``points``: a row per N, a column per series of ``names``, ``cell(record)`` each.

    Where a series has no point at some N the cell is empty.
    """
    by_key = {(series(record), record["n"]): record for record in points}
    header = "| N | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    rows = []
    for n in sorted({record["n"] for record in points}):
        cells = [cell(by_key[name, n]) if (name, n) in by_key else "" for name in names]
        rows.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return header + "\n".join(rows)
