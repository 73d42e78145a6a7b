"""Time, memory and recall@k of every key-search backend as N grows, against the GEMM floor.

Each point (backend, N) runs in a fresh process (per-point peak memory). Queries and keys are Gaussian,
or a random subset of the query/key tokens a trained model saved (``kmipgt train --save-tokens``), since
approximate search is only as good as the data is clustered. Recall@k is measured on a random sample of
queries against an exact reference computed for just those queries (cheap even at N = 1M), so it is
reported at every N; exact backends must show 1.0. The ``gemm`` series times one square ``matmul``
with the same multiply-adds as an exact search (``2·H·N²·d`` flops): the floor any exact search meets.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from kmipgt.bench import common
from kmipgt.bench.isolation import time_calls
from kmipgt.ops import APPROXIMATE_BACKENDS, SEARCH_BACKENDS, ProbeCalibration, topk_inner_product
from kmipgt.ops.search.ivf_common import check_recall
from kmipgt.safe_load import torch_load_safely

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
class SearchBenchConfig(common.PointBenchConfig):
    """What to measure. ``n_values``: nodes of the one graph searched. ``tokens``: a saved-token file."""

    backends: list[str] | None = field(
        default=None, metadata={"help": "search backends (default: all available here, on `device`)"}
    )
    gemm: bool = field(default=True, metadata={"help": "also time the square-GEMM floor series"})
    heads: int = field(default=1, metadata={"help": "attention heads"})
    dim: int = field(default=32, metadata={"help": "query/key head dimension d"})
    k: int = field(default=16, metadata={"help": "keys found per query"})
    nlist: int | None = field(default=None, metadata={"help": "IVF lists (ivf, faiss); default ~sqrt(N)"})
    nprobe: int | None = field(
        default=None, metadata={"help": "IVF lists probed (ivf, faiss), fixed instead of a recall target"}
    )
    recall: float | None = field(
        default=None, metadata={"help": "ivf, faiss: recall@k target nprobe is calibrated to (default 0.95)"}
    )
    clusters: int | None = field(
        default=None, metadata={"help": "queries and keys around this many centres (not Gaussian)"}
    )
    tokens: str | None = field(
        default=None, metadata={"help": "query/key tokens saved by `kmipgt train --save-tokens`"}
    )
    recall_queries: int = field(default=1024, metadata={"help": "queries sampled for recall@k"})
    # Fewer, longer runs than the base's defaults: a search point at large N takes minutes.
    repeats: int = 2
    time_budget: float = 300.0
    threads: int | None = field(default=None, metadata={"help": "torch CPU threads (default: one per core)"})

    def __post_init__(self) -> None:
        if self.backends is None:
            self.backends = default_backends(self.device)
        unknown = set(self.backends) - (set(SEARCH_BACKENDS) - {"auto"})
        if unknown:
            raise ValueError(f"`backends` must be among {SEARCH_BACKENDS[1:]}, got {sorted(unknown)}")
        super().__post_init__()
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"`threads` must be positive or None (torch's default), got {self.threads}")
        if self.recall_queries < 1:
            raise ValueError("`recall_queries` must be >= 1")
        common.check_positive(self, ("heads", "dim", "k", "nlist", "nprobe", "clusters"))
        check_recall(self.recall, self.nprobe)
        if self.clusters is not None and self.tokens is not None:
            raise ValueError("give `clusters` (synthetic tokens) or `tokens` (saved ones), not both")
        if self.tokens is not None and not Path(self.tokens).is_file():
            raise ValueError(
                f"`tokens` must be a file written by `kmipgt train --save-tokens`, got {self.tokens}"
            )

    def over_budget(self, previous: dict | None, params: dict) -> str | None:
        """Why the point would exceed a budget (:func:`~kmipgt.bench.common.predicted_over_budget`)."""
        # Exact search is quadratic in N; the inverted-file search grows about as N^1.5.
        exponent = 1.5 if params["backend"] in APPROXIMATE_BACKENDS else 2.0
        return common.predicted_over_budget(previous, params["n"], self, time_exponent=exponent)


def load_tokens(path: str, n: int, seed: int) -> tuple[Tensor, Tensor]:
    """A random subset of ``n`` nodes (in their original order) of saved ``[N, H, d]`` query/key tokens."""
    saved = torch_load_safely(path, path)
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
    if params.get("clusters") is None:
        return tuple(torch.randn(shape, generator=generator, device=device, dtype=dtype) for _ in range(2))
    return _clustered(params["clusters"], shape, generator, device, dtype)


def _clustered(
    clusters: int, shape: tuple[int, int, int], generator: torch.Generator, device: torch.device,
    dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """Queries and keys ``[N, H, d]`` around ``clusters`` shared centres per head (centres ``3·N(0, I)``,
    spread ``0.5·N(0, I)``): cluster structure like trained tokens', for approximate search."""
    n, heads, dim = shape
    centres = 3 * torch.randn(clusters, heads, dim, generator=generator, device=device, dtype=dtype)

    def draw() -> Tensor:
        member = torch.randint(0, clusters, (n,), generator=generator, device=device)
        return centres[member] + 0.5 * torch.randn(shape, generator=generator, device=device, dtype=dtype)

    return draw(), draw()


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
    """One (backend, N) point of a search: its time and sampled recall@k."""
    _set_threads(params.get("threads"))
    torch.manual_seed(params["seed"])
    query, key = _inputs(params)
    options = {}
    if params["backend"] in APPROXIMATE_BACKENDS:
        options = {name: params.get(name) for name in ("nlist", "nprobe", "recall")}

    def search(**extra):
        return topk_inner_product(query, key, params["k"], backend=params["backend"], **options, **extra)

    timing = time_calls(search, params["repeats"], params["warmup"], query.device)
    calibration = ProbeCalibration()
    _, index = search(calibration=calibration) if options else search()
    recall = _sampled_recall(query, key, index, params["k"], params["recall_queries"], params["seed"])
    # What calibrated probing chose per (graph, head) index, and the recall it measured on its sample
    # (nothing with a fixed nprobe, or where every graph was searched exactly).
    chosen = {"nprobe_chosen": calibration.nprobe, "recall_calibrated": calibration.recall}
    chosen = chosen if calibration.nprobe else {}
    return {**timing, "recall": recall, "heads": query.shape[1], "dim": query.shape[2], **chosen}


def measure_gemm(params: dict) -> dict:
    """One square ``matmul`` with the multiply-adds of an exact search at this N (``H·N²·d``)."""
    _set_threads(params.get("threads"))
    device, dtype = torch.device(params["device"]), getattr(torch, params["dtype"])
    size = round((params["heads"] * params["n"] ** 2 * params["dim"]) ** (1 / 3))
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    timing = time_calls(lambda: torch.matmul(a, b), params["repeats"], params["warmup"], device)
    return {**timing, "gemm_size": size, "gflops": 2 * size**3 / timing["time_median"] / 1e9}


def measure_point(params: dict) -> dict:
    """One (backend, N) point, a search's or the GEMM floor's: what ``run_budgeted`` runs in isolation."""
    return measure_gemm(params) if params["backend"] == GEMM else measure_search(params)


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
    specs = [{"backend": backend} for backend in list(config.backends) + ([GEMM] if config.gemm else [])]
    result = common.run_budgeted(config, "search", specs, shared, min_timeout=120.0)
    data = "Gaussian" if config.clusters is None else f"{config.clusters} clusters"
    data = data if config.tokens is None else f"tokens {Path(config.tokens).name}"
    title = f"key search, {data}, H={heads} d={dim} k={config.k} {config.dtype} on {config.device}"
    panels = [common.TIME_PANEL, common.MEMORY_PANEL, ("recall", "recall@k (sampled queries)", 1.0)]
    common.write_result(out_dir / "search", result, result["points"], _backend, panels, title)
    return result


def _backend(record: dict) -> str:
    return record["backend"]


def _cell(record: dict) -> str:
    if record["status"] != "ok":
        return record["status"]
    cell = f"{record['time_median']:.3g} s [{record['time_min']:.3g}–{record['time_max']:.3g}]"
    if record["backend"] == GEMM:
        return cell + f", {record['gflops']:.0f} GFLOP/s"
    cell += f", {record['peak_memory_bytes'] / 2**20:.0f} MiB, recall {record['recall']:.3f}"
    chosen = record.get("nprobe_chosen")
    if chosen:
        low, high = min(chosen), max(chosen)
        cell += f" (nprobe {low})" if low == high else f" (nprobe {low}–{high})"
    return cell


def search_markdown_table(result: dict) -> str:
    """Per N: time (median [min–max]), peak memory and recall of each backend, and the GEMM floor."""
    names = list(dict.fromkeys(r["backend"] for r in result["points"]))
    return common.series_table(result["points"], names, _backend, _cell)
