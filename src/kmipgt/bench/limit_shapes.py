"""k-MIP attention at the shapes where the CUDA kernels reach their limits, and the path each one takes.

Head dims past 128 (whose blocks outgrow a kernel's shared memory), k past 128 on small graphs (past the
Triton search's register buffer and the fused kernels' k) and bfloat16 each change what
:func:`~kmipgt.ops.kmip_attention` routes a batch to: the fused small-graph kernels, the Triton search, or
the torch search. Each shape is a batch of ragged graphs timed forward and backward as the model calls it
(its layout, ``backend="auto"``, no finiteness check) after one untimed call that compiles its kernels.

``python -m kmipgt.bench.limit_shapes --device cuda --out DIR`` writes ``DIR/limit_shapes.json``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from statistics import median

import torch

from kmipgt.bench.common import write_json
from kmipgt.machine import machine_info
from kmipgt.ops import kmip_attention
from kmipgt.ops.ragged import RaggedLayout
from kmipgt.ops.search.registry import route, search_call
from kmipgt.ops.small_graphs import fused_kernel_serves

__all__ = ["LIMIT_SHAPES", "main", "run_limit_shapes"]

# name -> (dtype, head dim, k, smallest and largest graph); 64 graphs of 4 heads each.
LIMIT_SHAPES = {
    "d160-float32": ("float32", 160, 5, 100, 199),
    "d256-float32": ("float32", 256, 5, 100, 199),
    "d160-bfloat16": ("bfloat16", 160, 5, 100, 199),
    "d256-bfloat16": ("bfloat16", 256, 5, 100, 199),
    "k200-float32": ("float32", 19, 200, 129, 256),
    "k200-bfloat16": ("bfloat16", 19, 200, 129, 256),
    "peptides-bfloat16": ("bfloat16", 19, 5, 100, 199),
}
_GRAPHS, _HEADS = 64, 4


def _path(query: torch.Tensor, k: int, layout: RaggedLayout) -> str:
    """What ``backend="auto"`` runs for this batch: ``fused attention`` or ``search: <backend>``."""
    k = min(k, layout.max_nodes)
    if fused_kernel_serves(query, query, k, layout):
        return "fused attention"
    return f"search: {route(search_call(query, k, layout.ptr, queries_differ=False)).name}"


def _measure(name: str, device: torch.device, repeats: int) -> dict:
    dtype_name, dim, k, min_nodes, max_nodes = LIMIT_SHAPES[name]
    gen = torch.Generator().manual_seed(0)
    sizes = torch.randint(min_nodes, max_nodes + 1, (_GRAPHS,), generator=gen)
    layout = RaggedLayout(torch.cat([sizes.new_zeros(1), sizes.cumsum(0)]), device)
    shape = (layout.num_nodes, _HEADS, dim)
    leaves = [
        torch.randn(shape, generator=gen).to(device, getattr(torch, dtype_name)).requires_grad_()
        for _ in range(3)
    ]
    times = []
    for run in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        out = kmip_attention(*leaves, k, layout=layout, check_finite=False)
        torch.autograd.grad(out.float().sum(), leaves)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if run > 0:  # the first call compiles
            times.append(time.perf_counter() - start)
    return {
        "shape": name, "dtype": dtype_name, "dim": dim, "k": k, "graphs": _GRAPHS, "heads": _HEADS,
        "nodes": layout.num_nodes, "largest_graph": layout.max_nodes, "path": _path(leaves[0], k, layout),
        "forward_backward_ms": median(times) * 1e3, "min_ms": min(times) * 1e3, "max_ms": max(times) * 1e3,
    }


def run_limit_shapes(device: str, out_dir: Path, repeats: int = 5) -> dict:
    """Time every shape of :data:`LIMIT_SHAPES` forward and backward on ``device``; write and return
    ``{"machine": ..., "shapes": [{"shape", "path", "forward_backward_ms", ...}]}``."""
    torch_device = torch.device(device)
    result = {
        "machine": machine_info(device),
        "shapes": [_measure(name, torch_device, repeats) for name in LIMIT_SHAPES],
    }
    write_json(result, out_dir / "limit_shapes.json")
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="torch device")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per shape (median reported)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/limit-shapes"), help="output folder")
    args = parser.parse_args(argv)
    for shape in run_limit_shapes(args.device, args.out, args.repeats)["shapes"]:
        print(f"{shape['shape']:>18}  {shape['path']:>15}  {shape['forward_backward_ms']:9.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
