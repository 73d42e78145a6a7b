"""Time, memory and recall@k of every key-search backend as N grows, against the GEMM floor.

Each point (backend, N) runs in a fresh process (per-point peak memory). Queries and keys are Gaussian,
or a random subset of the query/key tokens a trained model saved (``kmipgt train --save-tokens``), since
approximate search is only as good as the data is clustered. Recall@k is measured on a random sample of
queries against an exact reference computed for just those queries (cheap even at N = 1M), so it is
reported at every N; exact backends must show 1.0. The ``gemm`` series times one square ``matmul``
with the same multiply-adds as an exact search (``2·H·N²·d`` flops): the floor any exact search meets.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor
from tqdm import tqdm

from kmipgt.bench.attention import check_positive, machine_info
from kmipgt.bench.isolation import run_isolated, time_calls
from kmipgt.bench.plotting import plot_scaling
from kmipgt.ops import APPROXIMATE_BACKENDS, SEARCH_BACKENDS, topk_inner_product

__all__ = ["GEMM", "SearchBenchConfig", "default_backends", "run_search_benchmark", "search_markdown_table"]

GEMM = "gemm"
# Score elements per chunk of the recall reference: 16 MiB of float32, small next to a search's own
# peak memory (which the point's peak also includes).
_REFERENCE_CHUNK = 1 << 22


def default_backends(device: str) -> list[str]:
    """Every backend that can run on ``device`` with what is installed here."""
    import importlib.util

    backends = ["torch", "fused", "ivf"] if device == "cpu" else ["torch", "triton", "ivf"]
    if device == "cpu" and importlib.util.find_spec("faiss") is not None:
        backends.append("faiss")
    if importlib.util.find_spec("pykeops") is not None:
        backends.append("keops")
    return backends


@dataclass
class SearchBenchConfig:
    """What to measure. ``n_values``: nodes of the one graph searched. ``tokens``: a saved-token file."""

    n_values: list[int]
    backends: list[str] = field(default_factory=lambda: default_backends("cpu"))
    gemm: bool = True
    heads: int = 1
    dim: int = 32
    k: int = 16
    nlist: int | None = None
    nprobe: int | None = None
    tokens: str | None = None
    recall_queries: int = 1024
    repeats: int = 2
    warmup: int = 1
    device: str = "cpu"
    dtype: str = "float32"
    time_budget: float = 300.0
    memory_budget_gb: float = 16.0
    threads: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        unknown = set(self.backends) - (set(SEARCH_BACKENDS) - {"auto"})
        if unknown:
            raise ValueError(f"`backends` must be among {SEARCH_BACKENDS[1:]}, got {sorted(unknown)}")
        if not self.n_values or min(self.n_values) < 1:
            raise ValueError(f"`n_values` must be positive node counts, got {self.n_values}")
        self.n_values = sorted(self.n_values)
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"`threads` must be positive or None (torch's default), got {self.threads}")
        if self.repeats < 1 or self.warmup < 0 or self.recall_queries < 1:
            raise ValueError("`repeats` and `recall_queries` must be >= 1 and `warmup` >= 0")
        check_positive(self, ("heads", "dim", "k", "nlist", "nprobe", "time_budget", "memory_budget_gb"))
        if self.tokens is not None and not Path(self.tokens).is_file():
            raise ValueError(
                f"`tokens` must be a file written by `kmipgt train --save-tokens`, got {self.tokens}"
            )


def load_tokens(path: str, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """A random subset of ``n`` nodes (in their original order) of saved ``[N, H, d]`` query/key tokens."""
    saved = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(saved, dict) or "query" not in saved or "key" not in saved:
        raise ValueError(f"{path} must hold a dict with 'query' and 'key' tensors of shape [N, H, d]")
    query, key = saved["query"], saved["key"]
    if query.dim() != 3 or query.shape != key.shape:
        raise ValueError(f"{path}: 'query' and 'key' must share a shape [N, H, d], got {tuple(query.shape)}")
    if n > query.shape[0]:
        raise ValueError(f"{path} holds {query.shape[0]} nodes, fewer than N = {n}")
    rows = torch.randperm(query.shape[0], generator=torch.Generator().manual_seed(seed))[:n].sort().values
    return query[rows].contiguous(), key[rows].contiguous()


def _inputs(params: dict) -> tuple[Tensor, Tensor]:
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    if params["tokens"] is not None:
        query, key = load_tokens(params["tokens"], params["n"], params["seed"])
        return query.to(device, dtype), key.to(device, dtype)
    generator = torch.Generator(device=device).manual_seed(params["seed"])
    shape = (params["n"], params["heads"], params["dim"])
    return tuple(torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(2))


def _sampled_recall(
    query: torch.Tensor, key: torch.Tensor, index: torch.Tensor, k: int, samples: int, seed: int
):
    """Mean |found ∩ exact| / k over ``samples`` random queries and all heads; exact by chunked matmul."""
    n = query.shape[0]
    rows = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 1))[:samples].to(query.device)
    width = min(k, n)
    hits = 0
    chunk = max(1, _REFERENCE_CHUNK // (n * query.shape[1]))
    keys_t = key.transpose(0, 1).transpose(1, 2).float()
    for start in range(0, rows.numel(), chunk):
        part = rows[start : start + chunk]
        scores = torch.matmul(query[part].transpose(0, 1).float(), keys_t)
        exact = scores.topk(width, dim=-1).indices.transpose(0, 1)
        found = index[part, :, :width]
        hits += int((found[..., :, None] == exact[..., None, :]).any(-1).sum())
    return hits / (rows.numel() * query.shape[1] * width)


def _set_threads(threads: int | None) -> None:
    if threads is not None:
        torch.set_num_threads(threads)


def measure_search(params: dict) -> dict:
    """One (backend, N) point; runs inside :func:`run_isolated`."""
    _set_threads(params.get("threads"))
    torch.manual_seed(params["seed"])
    query, key = _inputs(params)
    options = {}
    if params["backend"] in APPROXIMATE_BACKENDS:
        options = {"nlist": params["nlist"], "nprobe": params["nprobe"]}

    def search():
        return topk_inner_product(query, key, params["k"], backend=params["backend"], **options)

    timing = time_calls(search, params["repeats"], params["warmup"], query.device)
    _, index = search()
    recall = _sampled_recall(query, key, index, params["k"], params["recall_queries"], params["seed"])
    return {**timing, "recall": recall, "heads": query.shape[1], "dim": query.shape[2]}


def measure_gemm(params: dict) -> dict:
    """One square ``matmul`` with the multiply-adds of an exact search at this N (``H·N²·d``)."""
    _set_threads(params.get("threads"))
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    size = round((params["heads"] * params["n"] ** 2 * params["dim"]) ** (1 / 3))
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    timing = time_calls(lambda: torch.matmul(a, b), params["repeats"], params["warmup"], device)
    return {**timing, "gemm_size": size, "gflops": 2 * size**3 / timing["time_median"] / 1e9}


def _predicted_over_budget(previous: dict | None, params: dict, config: SearchBenchConfig) -> str | None:
    if previous is None:
        return None
    if previous["status"] != "ok":
        return "a smaller N of this series was already over budget"
    growth = params["n"] / previous["n"]
    # Exact search is quadratic in N; the inverted-file search grows about as N^1.5.
    exponent = 1.5 if params["backend"] in APPROXIMATE_BACKENDS else 2.0
    if previous["time_median"] * growth**exponent * (config.repeats + config.warmup) > config.time_budget:
        return f"predicted time over the {config.time_budget:.0f} s budget"
    if previous["peak_memory_bytes"] * growth > config.memory_budget_gb * 2**30:
        return f"predicted memory over the {config.memory_budget_gb:.0f} GB budget"
    return None


def _heads_dim(config: SearchBenchConfig) -> tuple[int, int]:
    if config.tokens is None:
        return config.heads, config.dim
    shape = torch.load(config.tokens, map_location="cpu", weights_only=True)["query"].shape
    return shape[1], shape[2]


def run_search_benchmark(config: SearchBenchConfig, out_dir: Path) -> dict:
    """Measure every (backend, N) point and the GEMM floor; write ``search.json`` and ``search.png``."""
    heads, dim = _heads_dim(config)
    shared = {**asdict(config), "heads": heads, "dim": dim}
    del shared["n_values"], shared["backends"]
    series = list(config.backends) + ([GEMM] if config.gemm else [])
    records: list[dict] = []
    previous: dict[str, dict] = {}
    todo = [(backend, n) for backend in series for n in config.n_values]
    for backend, n in tqdm(todo, desc="bench search", unit="point"):
        params = {**shared, "backend": backend, "n": n}
        record = {"backend": backend, "n": n}
        reason = _predicted_over_budget(previous.get(backend), params, config)
        if reason:
            record |= {"status": "skipped", "reason": reason}
        else:
            target = "kmipgt.bench.search:" + ("measure_gemm" if backend == GEMM else "measure_search")
            record |= run_isolated(target, params, max(120.0, 2 * config.time_budget))
        previous[backend] = record
        records.append(record)
    result = {"config": asdict(config), "machine": machine_info(config.device), "points": records}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "search.json").write_text(json.dumps(result, indent=2))
    data = "Gaussian" if config.tokens is None else f"tokens {Path(config.tokens).name}"
    plot_scaling(
        records,
        lambda record: record["backend"],
        [
            ("time_median", "time (s, median)", 1.0),
            ("peak_memory_bytes", "peak memory (MiB)", 2**-20),
            ("recall", "recall@k (sampled queries)", 1.0),
        ],
        out_dir / "search.png",
        f"key search, {data}, H={heads} d={dim} k={config.k} {config.dtype} on {config.device}",
    )
    return result


def search_markdown_table(result: dict) -> str:
    """Per N: time (median [min–max]), peak memory and recall of each backend, and the GEMM floor."""
    names = list(dict.fromkeys(r["backend"] for r in result["points"]))
    by_key = {(r["backend"], r["n"]): r for r in result["points"]}
    header = "| N | " + " | ".join(names) + " |\n|---|" + "---|" * len(names) + "\n"
    rows = []
    for n in sorted({r["n"] for r in result["points"]}):
        cells = []
        for name in names:
            record = by_key.get((name, n))
            if record is None or record["status"] != "ok":
                cells.append("" if record is None else record["status"])
                continue
            cell = f"{record['time_median']:.3g} s [{record['time_min']:.3g}–{record['time_max']:.3g}]"
            if name == GEMM:
                cell += f", {record['gflops']:.0f} GFLOP/s"
            else:
                cell += f", {record['peak_memory_bytes'] / 2**20:.0f} MiB, recall {record['recall']:.3f}"
            cells.append(cell)
        rows.append(f"| {n:,} | " + " | ".join(cells) + " |")
    return header + "\n".join(rows)
