"""``kmipgt bench``: the benchmarks, each writing JSON + PNG (or markdown) and printing a table.

The options of a benchmark with a config dataclass are that dataclass's fields (:func:`add_fields`), added
once the benchmark is chosen: its module imports torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kmipgt.atomic import atomic_write_json, atomic_write_text
from kmipgt.cli.parser import add_checkpoint, add_fields, add_overrides, config_from_args, csv, positive_int
from kmipgt.cli.runs import load_config, use_run_allocator


def _add_sizes(parser: argparse.ArgumentParser, n_min: int, n_max: int, min_help: str, max_help: str) -> None:
    parser.add_argument("--n-min", type=int, default=n_min, help=min_help)
    parser.add_argument("--n-max", type=int, default=n_max, help=max_help)
    parser.add_argument("--n", type=csv(int), default=None, help="explicit comma-separated N values")


def _attention_options(parser: argparse.ArgumentParser) -> None:
    from kmipgt.bench.attention import AttentionBenchConfig

    _add_sizes(parser, 1024, 262_144, "smallest N (nodes per graph)", "largest N (grid doubles from --n-min)")
    add_fields(parser, AttentionBenchConfig, exclude=("n_values",))
    parser.add_argument("--out", type=Path, default=Path("bench-out"), help="folder of attention.json/.png")


def _bench_attention(args: argparse.Namespace) -> int:
    from kmipgt.bench.attention import AttentionBenchConfig, markdown_table, run_attention_benchmark
    from kmipgt.bench.common import geometric_grid

    n_values = args.n or geometric_grid(args.n_min, args.n_max)
    result = run_attention_benchmark(
        config_from_args(AttentionBenchConfig, args, n_values=n_values), args.out
    )
    print(markdown_table(result))
    print(f"wrote {args.out / 'attention.json'} and {args.out / 'attention.png'}")
    return 0


def _search_options(parser: argparse.ArgumentParser) -> None:
    from kmipgt.bench.search import SearchBenchConfig

    _add_sizes(parser, 4096, 1_048_576, "smallest N (nodes of the graph)", "largest N (grid ×4 from --n-min)")
    add_fields(parser, SearchBenchConfig, exclude=("n_values",))
    parser.add_argument(
        "--out", type=Path, default=Path("bench-out/search"), help="folder of search.json/.png"
    )


def _bench_search(args: argparse.Namespace) -> int:
    from kmipgt.bench.common import geometric_grid
    from kmipgt.bench.search import SearchBenchConfig, run_search_benchmark, search_markdown_table

    n_values = args.n or geometric_grid(args.n_min, args.n_max, factor=4.0)
    result = run_search_benchmark(config_from_args(SearchBenchConfig, args, n_values=n_values), args.out)
    print(search_markdown_table(result))
    print(f"wrote {args.out / 'search.json'} and {args.out / 'search.png'}")
    return 0


def _grf_options(parser: argparse.ArgumentParser) -> None:
    from kmipgt.bench.grf import GRFBenchConfig

    add_fields(parser, GRFBenchConfig)
    parser.add_argument("--out", default="bench-out/grf", help="folder for grf.json and grf.png")


def _bench_grf(args: argparse.Namespace) -> int:
    from kmipgt.bench.grf import GRFBenchConfig, run_grf_benchmark

    result = run_grf_benchmark(config_from_args(GRFBenchConfig, args), args.out)
    for record in result["records"]:
        if record["status"] != "ok":
            print(f"{record['method']:>12} N={record['n']:>7}  {record['status']}: {record['reason']}")
        else:
            print(
                f"{record['method']:>12} N={record['n']:>7}  {record['time_min']:.4f} s  "
                f"{record['peak_memory_bytes'] / 2**20:9.1f} MiB peak  "
                f"{record['page_faults_per_call']:9.0f} page faults per call"
            )
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {args.out}/grf.json and {args.out}/grf.png")
    return 0


def _ragged_options(parser: argparse.ArgumentParser) -> None:
    from kmipgt.bench.ragged import RaggedBenchConfig

    add_fields(parser, RaggedBenchConfig)
    parser.add_argument(
        "--out", type=Path, default=Path("bench-out/ragged"), help="folder of ragged.json and ragged.png"
    )


def _bench_ragged(args: argparse.Namespace) -> int:
    from kmipgt.bench.ragged import RaggedBenchConfig, markdown_table, run_ragged_benchmark

    config = config_from_args(RaggedBenchConfig, args)
    result = run_ragged_benchmark(config, args.out)
    batch = result["batch"]
    print(f"{config.graphs} graphs, {batch['nodes']:,} nodes (largest {batch['largest_graph']}) on "
          f"{config.device}, {config.threads} thread(s); median of {config.repeats} interleaved rounds")
    print(markdown_table(result))
    print(f"wrote {args.out / 'ragged.json'} and {args.out / 'ragged.png'}")
    return 0


def _train_options(parser: argparse.ArgumentParser) -> None:
    from kmipgt.bench.train import TrainBenchConfig
    from kmipgt.data.city_networks import CITY_NUM_NODES

    parser.add_argument("--n-min", type=int, default=50000, help="smallest N")
    parser.add_argument(
        "--n-max", type=int, default=CITY_NUM_NODES["london"], help="largest N (always measured if in budget)"
    )
    parser.add_argument("--factor", type=float, default=2.0, help="ratio between successive N")
    add_fields(parser, TrainBenchConfig, exclude=("n_values", "overrides"))
    add_overrides(parser, "model.num_layers=4")
    parser.add_argument("--out", type=Path, default=Path("bench-out/train"), help="folder of train.json/.png")


def _bench_train(args: argparse.Namespace) -> int:
    from kmipgt.bench.common import geometric_grid
    from kmipgt.bench.train import TrainBenchConfig, run_train_benchmark

    n_values = sorted({*geometric_grid(args.n_min, args.n_max, args.factor), args.n_max})
    result = run_train_benchmark(config_from_args(TrainBenchConfig, args, n_values=n_values), args.out)
    for record in result["points"]:
        if record["status"] != "ok":
            print(f"{record['method']:>10} N={record['n']:>7}  {record['status']}: {record['reason']}")
        else:
            print(f"{record['method']:>10} N={record['n']:>7}  {record['time_per_epoch']:9.1f} s/epoch  "
                  f"{record['peak_memory_bytes'] / 2**20:9.1f} MiB")
    print(json.dumps(result["slopes"], indent=2))
    print(f"wrote {args.out}/train.json and {args.out}/train.png")
    return 0


def _approx_inputs(args: argparse.Namespace):
    """Load the run and check the grid and its k-MIP layers (ValueError/FileNotFoundError naming them)."""
    from kmipgt.analysis.tokens import kmip_layers
    from kmipgt.bench.approx import k_grid
    from kmipgt.train import load_run, split_graph

    use_run_allocator(args.run_dir)
    trainer = load_run(args.run_dir, args.checkpoint, trust_checkpoint=args.trust_checkpoint)
    kmip_layers(trainer.model)
    part = split_graph(trainer, args.split, args.graph)
    return trainer, part.graph, k_grid(part.graph.num_nodes, args.k)


def _bench_approx(args: argparse.Namespace) -> int:
    from kmipgt.bench.approx import run_approx_benchmark

    trainer, graph, ks = _approx_inputs(args)
    out = args.out if args.out is not None else args.run_dir / "approx"
    meta = {"run": str(args.run_dir), "dataset": trainer.data.name, "split": args.split, "graph": args.graph}
    result = run_approx_benchmark(
        trainer.model,
        graph,
        lambda: trainer.evaluate(("val", "test")),
        out,
        ks=ks,
        metric=trainer.config.task.metric,
        meta=meta,
        save_tokens=args.save_tokens,
        progress=not args.no_progress,
    )
    print("| layer | k | error | mass | overlap |\n|---|---|---|---|---|")
    for row in result["layers"]:
        overlap = "—" if row["overlap"] is None else f"{row['overlap']:.4f}"
        print(f"| {row['layer']} | {row['k']} | {row['error']:.4f} | {row['mass']:.4f} | {overlap} |")
    metric = result["metric"]
    for row in metric["inference_k"]:
        print(f"inference k={row['k']}: val {row['val']:.4f}  test {row['test']:.4f}")
    full = metric["full_attention"]
    print(f"full attention: val {full['val']:.4f}  test {full['test']:.4f}")
    print(f"wrote {out / 'approx.json'}, approx.png and approx_metric.png")
    return 0


def _bench_memory(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.overrides)
    from kmipgt.train.memory import memory_breakdown

    result = memory_breakdown(config)
    for view in ("state_mib", "saved_mib"):
        for name, mib in result[view].items():
            print(f"{view[:-4]:>6}  {name:<48} {mib:10.1f} MiB")
    for phase, rss in result["rss_mib"].items():
        print(f"   rss  {phase:<48} {rss['peak_mib']:10.1f} MiB peak, {rss['end_mib']:.1f} at its end")
    if args.out is not None:
        atomic_write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


def _bench_step(args: argparse.Namespace) -> int:
    settings = [*args.overrides, f"threads={args.threads}"]
    if args.device is not None:
        settings.append(f"device={args.device}")
    config = load_config(args.config, settings)
    from kmipgt.bench.common import write_json
    from kmipgt.train.step_time import markdown_table, step_breakdown

    result = step_breakdown(config, steps=args.steps, warmup=args.warmup)
    result = {"config": args.config, "overrides": args.overrides, **result}
    table = markdown_table(result)
    batch = result["batch"]
    print(f"{args.config} on {result['device']} ({result['threads']} threads, torch {result['torch']}): "
          f"{batch['graphs']} graphs, {batch['nodes']} nodes, {batch['edges']} edges per step; "
          f"median of {args.steps} steps")
    print(table)
    write_json(result, args.out / "step.json")
    atomic_write_text(args.out / "step.md", table + "\n")
    print(f"wrote {args.out / 'step.json'} and {args.out / 'step.md'}")
    return 0


def _add_run_benchmarks(bench: argparse._SubParsersAction) -> None:
    """The benchmarks of a trained run or of a run config."""
    approx = bench.add_parser(
        "approx", help="how well a trained run's k-MIP layers approximate full attention, vs k"
    )
    approx.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    approx.add_argument(
        "--k", type=csv(int), default=None, help="comma-separated k grid (default 1, 2, 4, ..., N)"
    )
    approx.add_argument("--split", default="test", help="split whose graph gives the tokens")
    approx.add_argument("--graph", type=int, default=0, help="graph of the split (graph/edge-level runs)")
    approx.add_argument("--save-tokens", action="store_true", help="also save q/k/v of every layer")
    approx.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/approx)")
    approx.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    add_checkpoint(approx)
    approx.set_defaults(handler=_bench_approx, config_allocator=True)
    memory = bench.add_parser(
        "memory", help="one full-batch training step: state, saved-for-backward bytes per component, RSS"
    )
    memory.add_argument("--config", required=True, help="a node-level run config (path or shipped name)")
    add_overrides(memory, "data.options.num_nodes=100000")
    memory.add_argument("--out", type=Path, default=None, help="also write the result to this JSON file")
    memory.set_defaults(handler=_bench_memory, config_allocator=True)
    step = bench.add_parser(
        "step", help="one training step of a config on stand-in data: data, attention, MPNN and the rest"
    )
    step.add_argument("--config", required=True, help="run config (path or shipped name)")
    add_overrides(step, "model.attention=none")
    step.add_argument("--steps", type=positive_int, default=5, help="timed steps (medians reported)")
    step.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    step.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    step.add_argument("--device", default=None, help="torch device (default: the config's `device`)")
    step.add_argument("--out", type=Path, default=Path("bench-out/step"), help="folder of step.json/.md")
    step.set_defaults(handler=_bench_step, config_allocator=True)


def _bench_compile(args: argparse.Namespace) -> int:
    settings = [*args.overrides, f"threads={args.threads}"]
    if args.device is not None:
        settings.append(f"device={args.device}")
    config = load_config(args.config, settings)
    from kmipgt.train.compile_time import compiled_step_benchmark, markdown_table, write_outputs

    result = compiled_step_benchmark(config, args.steps, args.warmup)
    result = {"config": args.config, "overrides": args.overrides, **result}
    print(f"{args.config} on {result['device']}, {result['threads']} thread(s); "
          f"median of {args.steps} interleaved rounds")
    print(markdown_table(result))
    write_outputs(result, args.out)
    print(f"wrote compile.json, compile.md and compile.png in {args.out}")
    return 0


def _add_compile_benchmark(bench: argparse._SubParsersAction) -> None:
    compiled = bench.add_parser(
        "compile", help="a compiled training step of a config against the eager one, interleaved"
    )
    compiled.add_argument("--config", required=True, help="run config (path or shipped name)")
    add_overrides(compiled, "model.attention=none")
    compiled.add_argument("--steps", type=positive_int, default=10, help="timed rounds (medians reported)")
    compiled.add_argument("--warmup", type=int, default=2, help="untimed steps of each first (compilation)")
    compiled.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads")
    compiled.add_argument("--device", default=None, help="torch device (default: the config's `device`)")
    compiled.add_argument(
        "--out", type=Path, default=Path("bench-out/compile"), help="folder of compile.json/.md/.png"
    )
    compiled.set_defaults(handler=_bench_compile, config_allocator=True)


def register(commands: argparse._SubParsersAction) -> None:
    bench = commands.add_parser("bench", help="benchmarks (JSON + PNG)").add_subparsers(
        dest="benchmark", required=True
    )
    configured = {
        "attention": ("time and memory of k-MIP vs full attention as N grows", _attention_options,
                      _bench_attention),
        "search": ("time, memory and recall@k of the key-search backends vs N", _search_options,
                   _bench_search),
        "grf": ("GRF-masked attention: time and memory vs N on 2-D grids", _grf_options, _bench_grf),
        "train": ("time per epoch and peak RSS of full-batch training vs N", _train_options, _bench_train),
        "ragged": ("k-MIP and full attention on a batch of small graphs vs one padded SDPA call",
                   _ragged_options, _bench_ragged),
    }
    for name, (description, options, handler) in configured.items():
        bench.add_parser(name, help=description, options=options).set_defaults(handler=handler)
    _add_run_benchmarks(bench)
    _add_compile_benchmark(bench)
