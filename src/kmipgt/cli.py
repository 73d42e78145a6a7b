"""The ``kmipgt`` command line: parse, call the library, print."""

from __future__ import annotations

import argparse
from pathlib import Path


def _csv(kind):
    return lambda text: [kind(item) for item in text.split(",") if item]


def _bench_attention(args: argparse.Namespace) -> int:
    from kmipgt.bench.attention import (
        AttentionBenchConfig,
        geometric_grid,
        markdown_table,
        run_attention_benchmark,
    )

    config = AttentionBenchConfig(
        n_values=args.n or geometric_grid(args.n_min, args.n_max),
        methods=args.methods,
        backends=args.backends,
        passes=args.passes,
        graphs=args.graphs,
        heads=args.heads,
        dim=args.dim,
        dim_v=args.dim_v,
        k=args.k,
        repeats=args.repeats,
        warmup=args.warmup,
        device=args.device,
        dtype=args.dtype,
        time_budget=args.time_budget,
        memory_budget_gb=args.memory_budget_gb,
        seed=args.seed,
    )
    result = run_attention_benchmark(config, args.out)
    print(markdown_table(result))
    print(f"wrote {args.out / 'attention.json'} and {args.out / 'attention.png'}")
    return 0


def _add_bench_attention(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser("attention", help="time and memory of k-MIP vs full attention as N grows")
    parser.add_argument("--n-min", type=int, default=1024, help="smallest N (nodes per graph)")
    parser.add_argument("--n-max", type=int, default=262_144, help="largest N (grid doubles from --n-min)")
    parser.add_argument("--n", type=_csv(int), default=None, help="explicit comma-separated N values")
    parser.add_argument("--methods", type=_csv(str), default=["kmip", "full", "full-naive"])
    parser.add_argument("--backends", type=_csv(str), default=["torch"], help="k-MIP search backends")
    parser.add_argument("--passes", type=_csv(str), default=["forward", "forward+backward"])
    parser.add_argument("--graphs", type=int, default=1, help="B graphs of N nodes each")
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=32, help="query/key head dimension d")
    parser.add_argument("--dim-v", type=int, default=32, help="value head dimension")
    parser.add_argument("-k", "--k", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64"])
    parser.add_argument("--time-budget", type=float, default=120.0, help="seconds per point, all runs")
    parser.add_argument("--memory-budget-gb", type=float, default=16.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.set_defaults(handler=_bench_attention)


def _bench_search(args: argparse.Namespace) -> int:
    from kmipgt.bench.attention import geometric_grid
    from kmipgt.bench.search import (
        SearchBenchConfig,
        default_backends,
        run_search_benchmark,
        search_markdown_table,
    )

    config = SearchBenchConfig(
        n_values=args.n or geometric_grid(args.n_min, args.n_max, factor=4.0),
        backends=args.backends or default_backends(args.device),
        gemm=not args.no_gemm,
        heads=args.heads,
        dim=args.dim,
        k=args.k,
        nlist=args.nlist,
        nprobe=args.nprobe,
        tokens=args.tokens,
        recall_queries=args.recall_queries,
        repeats=args.repeats,
        warmup=args.warmup,
        device=args.device,
        dtype=args.dtype,
        time_budget=args.time_budget,
        memory_budget_gb=args.memory_budget_gb,
        seed=args.seed,
    )
    result = run_search_benchmark(config, args.out)
    print(search_markdown_table(result))
    print(f"wrote {args.out / 'search.json'} and {args.out / 'search.png'}")
    return 0


def _add_bench_search(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser("search", help="time, memory and recall@k of the key-search backends vs N")
    parser.add_argument("--n-min", type=int, default=4096, help="smallest N (nodes of the graph)")
    parser.add_argument("--n-max", type=int, default=1_048_576, help="largest N (grid ×4 from --n-min)")
    parser.add_argument("--n", type=_csv(int), default=None, help="explicit comma-separated N values")
    parser.add_argument("--backends", type=_csv(str), default=None, help="default: all available here")
    parser.add_argument("--no-gemm", action="store_true", help="skip the square-GEMM floor series")
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=32, help="query/key head dimension d")
    parser.add_argument("-k", "--k", type=int, default=16)
    parser.add_argument("--nlist", type=int, default=None, help="IVF lists (ivf, faiss); default ~2·sqrt(N)")
    parser.add_argument("--nprobe", type=int, default=None, help="IVF lists probed (ivf, faiss)")
    parser.add_argument(
        "--tokens", default=None, help="query/key tokens saved by `kmipgt train --save-tokens`"
    )
    parser.add_argument("--recall-queries", type=int, default=1024, help="queries sampled for recall@k")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64"])
    parser.add_argument("--time-budget", type=float, default=300.0, help="seconds per point, all runs")
    parser.add_argument("--memory-budget-gb", type=float, default=16.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench-out/search"))
    parser.set_defaults(handler=_bench_search)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kmipgt", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="benchmarks (JSON + PNG)").add_subparsers(
        dest="benchmark", required=True
    )
    _add_bench_attention(bench)
    _add_bench_search(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)
