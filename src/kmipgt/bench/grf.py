"""Benchmark of GRF-masked linear attention: time and peak memory against N on 2-D grid graphs.

Each (method, N) point runs in a fresh interpreter (:func:`kmipgt.bench.isolation.run_isolated`, as
``bench attention`` and ``bench search``), so its peak resident memory (``ru_maxrss`` growth after the
imports: inputs, walks and the forwards) is not polluted by earlier points. Methods, all on the same
random ``q, k, v`` ``[N, H, d]``:

- ``grf``: :func:`kmipgt.grf.masked_linear_attention` (symmetric two-SpMM form) on features
  ``grf_features(walks, f)`` with per-head f. Timed per forward (features + attention) with the walks
  cached, as in training on a fixed graph; the one-off walk sampling is timed on its own and its
  memory is included in the peak.
- ``linear``: unmasked linear attention (:func:`kmipgt.grf.linear_attention`), the O(N) floor.
- ``grf_mask``: the same symmetric estimator through the explicit sparse ``M̂ = Φ̂Φ̂ᵀ``
  (``mask_pattern=grf_mask_pattern(walks)``, built once with the walks; ``M̂`` itself is rebuilt from f
  every forward): one SDDMM + one SpMM.
- ``grf_asym``: :func:`kmipgt.grf.asymmetric_masked_attention` (edge-list form, ``M̂ = Φ̂``) on the
  same features.
- ``dense``: the same GRF mask materialised as a dense ``[N, N]`` ``M̂ = Φ̂Φ̂ᵀ`` per head, then dense
  masked linear attention (what the authors' prototype does); only up to ``dense_max`` nodes.

- ``grf_layer`` / ``linear_layer``: a whole attention layer (q, k, v and output projections of
  ``heads * head_channels`` channels) around ``grf`` (:class:`kmipgt.nn.GRFAttention`, walks cached
  after its first call; without autograd it runs a chunk of nodes at a time) or around unmasked linear
  attention.

Forward passes run under ``torch.no_grad()`` with ``threads`` torch threads (default 1: on a CPU
shared with other jobs, every OpenMP-parallel op waited ~20 ms for its descheduled second thread in
our runs, so multi-threaded timings measured the scheduler, not the kernels).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from kmipgt.bench import common
from kmipgt.bench.isolation import time_calls

__all__ = ["GRFBenchConfig", "grid_edge_index", "run_grf_benchmark"]

METHODS = ("grf", "grf_mask", "grf_asym", "linear", "dense", "grf_layer", "linear_layer")


@dataclass(frozen=True)
class GRFBenchConfig:
    """What to measure. Sizes are powers of two from ``n_min`` to ``n_max`` (both included)."""

    n_min: int = field(default=2**10, metadata={"help": "smallest N (power of two)"})
    n_max: int = field(default=2**18, metadata={"help": "largest N (power of two)"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    head_channels: int = field(default=16, metadata={"help": "channels per head"})
    num_walks: int = field(default=4, metadata={"help": "random walks per node"})
    p_halt: float = field(default=0.5, metadata={"help": "probability that a walk halts at each step"})
    max_len: int = field(default=8, metadata={"help": "longest walk (steps)"})
    feature_map: str = field(default="relu", metadata={"help": "feature map f", "choices": ("relu", "elu")})
    dense_max: int = field(default=2**13, metadata={"help": "largest N for the dense-mask baseline"})
    repeats: int = field(default=3, metadata={"help": "timed forwards per point (minimum reported)"})
    threads: int = field(default=1, metadata={"help": "torch threads per measurement"})
    time_budget: float = field(default=600.0, metadata={"help": "seconds per point before time-out"})
    seed: int = field(default=0, metadata={"help": "seed of the inputs and walks"})
    methods: tuple[str, ...] | None = field(
        default=None, metadata={"help": f"comma-separated subset of {','.join(METHODS)} (default: all)"}
    )

    def walk_options(self) -> dict:
        """The walk options shared by the sampler and the GRF layer."""
        return dict(num_walks=self.num_walks, p_halt=self.p_halt, max_len=self.max_len, seed=self.seed)

    def sizes(self) -> list[int]:
        if self.n_min < 4 or self.n_max < self.n_min:
            raise ValueError(f"need 4 <= n_min <= n_max, got n_min={self.n_min}, n_max={self.n_max}")
        if self.n_min & (self.n_min - 1):
            raise ValueError(f"`n_min` must be a power of two (grids of 2^a x 2^b nodes), got {self.n_min}")
        if self.threads < 1:
            raise ValueError(f"`threads` must be positive, got {self.threads}")
        if self.repeats < 1:
            raise ValueError(f"`repeats` must be positive, got {self.repeats}")
        if self.methods is not None and (set(self.methods) - set(METHODS) or not self.methods):
            raise ValueError(f"`methods` must be a non-empty subset of {METHODS}, got {list(self.methods)}")
        sizes, n = [], self.n_min
        while n <= self.n_max:
            sizes.append(n)
            n *= 2
        return sizes


def grid_edge_index(height: int, width: int) -> torch.Tensor:
    """``[2, E]`` undirected 4-neighbour lattice, node ``r * width + c``.

    PyG's ``utils.grid`` builds the 8-neighbour lattice with self-loops, which is not the graph of the
    GRF paper's grid experiments.
    """
    ids = torch.arange(height * width).view(height, width)
    right = torch.stack([ids[:, :-1].flatten(), ids[:, 1:].flatten()])
    down = torch.stack([ids[:-1].flatten(), ids[1:].flatten()])
    edges = torch.cat([right, down], dim=1)
    return torch.cat([edges, edges.flip(0)], dim=1)


def _grid_shape(num_nodes: int) -> tuple[int, int]:
    """Near-square ``height x width = num_nodes`` for a power of two."""
    height = 2 ** (int(math.log2(num_nodes)) // 2)
    return height, num_nodes // height


def _dense_masked(features, q, k, v, feature_map):
    from kmipgt.grf import apply_feature_map

    phi_q, phi_k = apply_feature_map(q, feature_map), apply_feature_map(k, feature_map, is_query=False)
    outputs = []
    for h in range(q.shape[1]):
        phi = features[h]
        mask = torch.sparse.mm(phi, phi.to_dense().T)
        scores = (phi_q[:, h] @ phi_k[:, h].T) * mask
        outputs.append((scores @ v[:, h]) / (scores.sum(1, keepdim=True) + 1e-6))
    return torch.stack(outputs, dim=1)


def _inputs(num_nodes: int, config: GRFBenchConfig):
    height, width = _grid_shape(num_nodes)
    edge_index = grid_edge_index(height, width)
    shape = (num_nodes, config.heads, config.head_channels)
    q, k, v = torch.randn(shape), torch.randn(shape), torch.randn(shape)
    x = torch.randn(num_nodes, config.heads * config.head_channels)
    return (height, width), edge_index, q, k, v, x


def _runner(method: str, num_nodes: int, config: GRFBenchConfig, edge_index, q, k, v, x, record: dict):
    """A zero-argument callable running one forward of ``method``; one-off set-up is timed into ``record``."""
    from kmipgt.grf import (
        asymmetric_masked_attention,
        grf_features,
        grf_mask_pattern,
        linear_attention,
        masked_linear_attention,
        sample_walks,
    )
    from kmipgt.nn import GRFAttention

    fmap = config.feature_map
    if method == "linear":
        return lambda: linear_attention(q, k, v, feature_map=fmap)
    channels = config.heads * config.head_channels
    if method in ("grf_layer", "linear_layer"):
        module = GRFAttention(channels, config.heads, feature_map=fmap, **config.walk_options())
        if method == "linear_layer":  # the same projections around unmasked linear attention

            def linear_layer():
                qkv = module.query_key_value(x)
                return module.lin_out(linear_attention(*qkv, feature_map=fmap).reshape(num_nodes, -1))

            return linear_layer
        start = time.perf_counter()
        module(x, edge_index=edge_index)
        record["first_call_seconds"] = time.perf_counter() - start
        return lambda: module(x, edge_index=edge_index)
    start = time.perf_counter()
    walks = sample_walks(edge_index, num_nodes, **config.walk_options())
    record["walk_seconds"] = time.perf_counter() - start
    record["nnz"] = walks.nnz
    f = torch.exp(-0.5 * torch.arange(config.max_len + 1.0)).expand(config.heads, -1).contiguous()
    if method == "grf":
        return lambda: masked_linear_attention(q, k, v, grf_features(walks, f), feature_map=fmap)
    if method == "grf_mask":
        pattern = grf_mask_pattern(walks)
        record["mask_nnz"] = pattern.nnz
        return lambda: masked_linear_attention(
            q, k, v, grf_features(walks, f), feature_map=fmap, mask_pattern=pattern
        )
    if method == "grf_asym":
        return lambda: asymmetric_masked_attention(q, k, v, grf_features(walks, f), score=fmap)
    features = grf_features(walks, f)
    return lambda: _dense_masked(features, q, k, v, fmap)


def measure_grf(params: dict) -> dict:
    """One (method, N) point; runs inside :func:`~kmipgt.bench.isolation.run_isolated`."""
    config = GRFBenchConfig(**{f.name: params[f.name] for f in fields(GRFBenchConfig)})
    method, num_nodes = params["method"], params["n"]
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    grid, edge_index, q, k, v, x = _inputs(num_nodes, config)
    record = {"grid": list(grid)}
    with torch.no_grad():
        run = _runner(method, num_nodes, config, edge_index, q, k, v, x, record)
        timing = time_calls(run, config.repeats, warmup=1, device=torch.device("cpu"))
    return {**record, **timing}


def scaling_summary(records: list[dict], low: int, high: int) -> dict:
    """Time and memory ratios per x4 step in N from ``low`` to ``high``, and against linear at ``high``.

    Times are the fastest of the repeats, the estimate least disturbed by other load on a shared CPU.
    """
    by_key = {(r["method"], r["n"]): r for r in records if r.get("status") == "ok"}

    def ratio(a: dict, b: dict) -> dict:
        return {
            "time": a["time_min"] / b["time_min"],
            "memory": a["peak_memory_bytes"] / max(b["peak_memory_bytes"], 1),
        }

    steps: dict[str, list] = {}
    for method in METHODS:
        n = low
        while n * 4 <= high:
            small, large = by_key.get((method, n)), by_key.get((method, n * 4))
            if small and large:
                steps.setdefault(method, []).append({"from": n, "to": n * 4, **ratio(large, small)})
            n *= 4
    against = {}
    for method, reference in (
        ("grf", "linear"),
        ("grf_mask", "linear"),
        ("grf_asym", "linear"),
        ("grf_layer", "linear_layer"),
    ):
        if (method, high) in by_key and (reference, high) in by_key:
            against[f"{method}/{reference}"] = ratio(by_key[(method, high)], by_key[(reference, high)])
    return {"low": low, "high": high, "x4_steps": steps, "at_high": against}


def run_grf_benchmark(config: GRFBenchConfig, out_dir: str | Path) -> dict:
    """Measure every (method, N) point in a fresh process; write ``grf.json`` and ``grf.png``."""
    points = [
        ({"method": m}, n)
        for n in config.sizes()
        for m in METHODS
        if (config.methods is None or m in config.methods) and (m != "dense" or n <= config.dense_max)
    ]
    records = common.run_points(
        points,
        asdict(config),
        "kmipgt.bench.grf:measure_grf",
        config.time_budget,
        desc="bench grf",
    )
    summary = scaling_summary(records, 2**14, min(2**18, config.n_max))
    result = common.bench_result(config, "cpu", records=records, summary=summary)
    common.write_result(
        Path(out_dir) / "grf",
        result,
        records,
        _method,
        [("time_min", "forward time, best of repeats (s)", 1.0), common.MEMORY_PANEL],
        f"GRF-masked linear attention on 2-D grids, H={config.heads} d={config.head_channels}, "
        f"{config.threads} thread(s)",
    )
    return result


def _method(record: dict) -> str:
    return record["method"]
