"""Command line: ``kmipgt bench grf`` (thin: parse, call, print)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence


def _add_bench_grf(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser("grf", help="GRF-masked attention: time and memory vs N on 2-D grids")
    parser.add_argument("--n-min", type=int, default=2**10, help="smallest N (power of two)")
    parser.add_argument("--n-max", type=int, default=2**18, help="largest N (power of two)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-channels", type=int, default=16)
    parser.add_argument("--num-walks", type=int, default=4)
    parser.add_argument("--p-halt", type=float, default=0.5)
    parser.add_argument("--max-len", type=int, default=8)
    parser.add_argument("--feature-map", default="relu", choices=["relu", "elu"])
    parser.add_argument("--dense-max", type=int, default=2**13, help="largest N for the dense-mask baseline")
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards per point (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-out/grf", help="folder for grf.json and grf.png")


def _run_bench_grf(args: argparse.Namespace) -> None:
    from kmipgt.bench.grf import GRFBenchConfig, run_grf_benchmark

    config = GRFBenchConfig(
        n_min=args.n_min,
        n_max=args.n_max,
        heads=args.heads,
        head_channels=args.head_channels,
        num_walks=args.num_walks,
        p_halt=args.p_halt,
        max_len=args.max_len,
        feature_map=args.feature_map,
        dense_max=args.dense_max,
        repeats=args.repeats,
        threads=args.threads,
        seed=args.seed,
    )
    result = run_grf_benchmark(config, args.out)
    for record in result["records"]:
        if "error" in record:
            print(f"{record['method']:>12} N={record['num_nodes']:>7}  {record['error']}")
        else:
            print(
                f"{record['method']:>12} N={record['num_nodes']:>7}  {record['seconds_min']:.4f} s  "
                f"{record['peak_bytes'] / 2**20:9.1f} MiB"
            )
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {args.out}/grf.json and {args.out}/grf.png")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kmipgt", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    bench = commands.add_parser("bench", help="benchmarks").add_subparsers(dest="bench", required=True)
    _add_bench_grf(bench)
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.command == "bench" and args.bench == "grf":
        _run_bench_grf(args)


if __name__ == "__main__":
    main()
