"""Attention on a batch of many small graphs of uneven sizes (the LRGB shape), against one padded SDPA call.

On one huge graph the search dominates; on a batch of 200 molecules every fixed cost per call (launches,
host syncs, validation, gathers of ``[N, H, k, d]`` rows) counts as much as the arithmetic. This benchmark
times, in one process and interleaved round by round so the methods share the machine's noise:

- ``kmip``: :func:`~kmipgt.ops.kmip_attention` as the model calls it (the batch's layout, no finiteness
  check, ``backend="auto"``: the fused small-graph kernel where one serves);
- ``kmip-search+gather``: the same with the exact search backend named explicitly, which runs the search
  and then the selected softmax in torch gathers (the path every backend other than ``auto`` takes);
- ``full``: :func:`~kmipgt.ops.full_attention` on the layout;
- ``sdpa-padded``: one ``scaled_dot_product_attention`` call on inputs already padded to ``[G, H, n_max, d]``
  with a key-padding mask: the bound the attention functions are measured against.

On CUDA it also counts the host syncs of one call (``torch.cuda.set_sync_debug_mode("warn")``).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import torch
import torch.nn.functional as F

from kmipgt.atomic import save_figure
from kmipgt.bench import common
from kmipgt.ops import full_attention, kmip_attention
from kmipgt.ops.ragged import RaggedLayout

__all__ = ["RAGGED_METHODS", "RaggedBenchConfig", "markdown_table", "run_ragged_benchmark"]

RAGGED_METHODS = ("kmip", "kmip-search+gather", "full", "sdpa-padded")
_EXACT_SEARCH = {"cpu": "fused", "cuda": "triton"}


@dataclass
class RaggedBenchConfig:
    """The batch: ``graphs`` graphs of ``min_nodes``–``max_nodes`` nodes (uniform, fixed ``seed``).

    The defaults are a Peptides-func batch of the shipped recipe: 200 graphs of 100–199 nodes, 4 heads of
    19 channels, k = 5.
    """

    graphs: int = field(default=200, metadata={"help": "graphs in the batch"})
    min_nodes: int = field(default=100, metadata={"help": "smallest graph (uniform sizes)"})
    max_nodes: int = field(default=199, metadata={"help": "largest graph"})
    heads: int = field(default=4, metadata={"help": "attention heads"})
    dim: int = field(default=19, metadata={"help": "channels per head"})
    k: int = field(default=5, metadata={"help": "keys each query attends to"})
    device: str = field(default="cpu", metadata={"help": "torch device"})
    dtype: str = field(default="float32", metadata={"help": "dtype of the inputs"})
    threads: int = field(default=1, metadata={"help": "torch CPU threads"})
    repeats: int = field(default=10, metadata={"help": "interleaved timed rounds"})
    warmup: int = field(default=2, metadata={"help": "untimed rounds first"})
    seed: int = field(default=0, metadata={"help": "seed of the graph sizes and inputs"})

    def __post_init__(self) -> None:
        common.check_positive(self, ("graphs", "min_nodes", "heads", "dim", "k", "threads", "repeats"))
        if self.max_nodes < self.min_nodes:
            raise ValueError(f"`max_nodes` ({self.max_nodes}) must be >= `min_nodes` ({self.min_nodes})")
        if self.warmup < 0:
            raise ValueError(f"`warmup` must be >= 0, got {self.warmup}")


def _batch(config: RaggedBenchConfig) -> tuple[RaggedLayout, list[torch.Tensor], torch.Tensor]:
    """The layout, ``[query, key, value]`` ``[N, H, d]`` leaves and ``[G]`` graph sizes on the device."""
    gen = torch.Generator().manual_seed(config.seed)
    sizes = torch.randint(config.min_nodes, config.max_nodes + 1, (config.graphs,), generator=gen)
    ptr = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)])
    device, dtype = torch.device(config.device), getattr(torch, config.dtype)
    shape = (int(ptr[-1]), config.heads, config.dim)
    tensors = [torch.randn(shape, generator=gen).to(device, dtype).requires_grad_() for _ in range(3)]
    return RaggedLayout(ptr, device), tensors, sizes.to(device)


def _methods(config: RaggedBenchConfig, layout: RaggedLayout, tensors, sizes) -> dict:
    """Each method as a function of ``(query, key, value)`` leaves returning its output."""
    width = layout.max_nodes
    graph, position = layout.node_graph_position()
    mask = (torch.arange(width, device=layout.device) < sizes[:, None])[:, None, None, :]

    def padded(tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.new_zeros(layout.num_graphs, width, *tensor.shape[1:])
        out[graph, position] = tensor.detach()
        return out.transpose(1, 2).contiguous().requires_grad_(tensor.requires_grad)

    padded_inputs = [padded(tensor) for tensor in tensors]
    search = _EXACT_SEARCH[layout.device.type]
    return {
        "kmip": lambda: kmip_attention(*tensors, config.k, layout=layout, check_finite=False),
        "kmip-search+gather": lambda: kmip_attention(
            *tensors, config.k, layout=layout, check_finite=False, backend=search
        ),
        "full": lambda: full_attention(*tensors, layout=layout, check_finite=False),
        "sdpa-padded": lambda: F.scaled_dot_product_attention(*padded_inputs, attn_mask=mask),
    }, tensors + padded_inputs


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# What torch's sync debug mode warns with at each synchronizing call. Its first use also warns that the mode
# is a prototype ("Synchronization debug mode is ..."), which is no sync and must not be counted.
SYNC_WARNING = "called a synchronizing CUDA operation"


def _host_syncs(call, device: torch.device) -> int | None:
    """Host syncs of one forward+backward of ``call`` on CUDA (None on the CPU, where none can stall)."""
    if device.type != "cuda":
        return None
    _synchronize(device)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            call().float().sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum(SYNC_WARNING in str(warning.message) for warning in caught)


def run_ragged_benchmark(config: RaggedBenchConfig, out_dir: Path) -> dict:
    """Time every method's forward and forward+backward; write ``ragged.json`` and ``ragged.png``."""
    torch.set_num_threads(config.threads)
    layout, tensors, sizes = _batch(config)
    methods, leaves = _methods(config, layout, tensors, sizes)
    device = layout.device

    def forward(call):
        with torch.no_grad():
            call()

    def forward_backward(call):
        call().float().sum().backward()
        for leaf in leaves:
            leaf.grad = None

    passes = {"forward": forward, "forward+backward": forward_backward}
    times: dict[tuple[str, str], list[float]] = {(m, p): [] for m in methods for p in passes}
    for round_ in range(config.warmup + config.repeats):
        for (method, pass_), measured in times.items():
            _synchronize(device)
            start = time.perf_counter()
            passes[pass_](methods[method])
            _synchronize(device)
            if round_ >= config.warmup:
                measured.append(time.perf_counter() - start)
    bound = {p: median(times["sdpa-padded", p]) for p in passes}
    records = [
        {
            "method": method, "pass": pass_, "time_median": median(measured), "time_min": min(measured),
            "time_max": max(measured), "times": measured, "vs_sdpa_padded": median(measured) / bound[pass_],
            "host_syncs": _host_syncs(methods[method], device) if pass_ == "forward+backward" else None,
        }
        for (method, pass_), measured in times.items()
    ]
    shape = {"nodes": layout.num_nodes, "largest_graph": layout.max_nodes}
    result = common.bench_result(config, config.device, batch=shape, records=records)
    common.write_json(result, out_dir / "ragged.json")
    _plot(records, out_dir / "ragged.png", config, layout)
    return result


def _plot(records: list[dict], path: Path, config: RaggedBenchConfig, layout: RaggedLayout) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    passes = list(dict.fromkeys(r["pass"] for r in records))
    width = 0.8 / len(passes)
    for offset, pass_ in enumerate(passes):
        rows = [r for r in records if r["pass"] == pass_]
        positions = [i + offset * width for i in range(len(rows))]
        ax.bar(positions, [r["time_median"] * 1e3 for r in rows], width, label=pass_)
        ax.set_xticks([i + width * (len(passes) - 1) / 2 for i in range(len(rows))])
        ax.set_xticklabels([r["method"] for r in rows])
    ax.set_ylabel("ms (median)")
    ax.set_title(
        f"{config.graphs} graphs, N={layout.num_nodes:,}, H={config.heads} d={config.dim} k={config.k}, "
        f"{config.device}, {config.threads} thread(s)", fontsize=9,
    )
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def markdown_table(result: dict) -> str:
    """Median ms (min–max) per method and pass, with the ratio to one padded SDPA call."""
    lines = ["| method | pass | median ms [min–max] | × sdpa-padded | host syncs |", "|---|---|---|---|---|"]
    for r in result["records"]:
        syncs = "" if r["host_syncs"] is None else str(r["host_syncs"])
        lines.append(
            f"| {r['method']} | {r['pass']} | {r['time_median'] * 1e3:.1f} "
            f"[{r['time_min'] * 1e3:.1f}–{r['time_max'] * 1e3:.1f}] | {r['vs_sdpa_padded']:.2f} | {syncs} |"
        )
    return "\n".join(lines)
