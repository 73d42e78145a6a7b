"""The ``kmipgt`` command line: parse, call the library, print.

Heavy imports (torch, PyG) happen inside the handlers, after the config is read and checked, so a bad key
or option is reported at once.
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import shlex
import sys
import traceback
from pathlib import Path

from kmipgt.logs import configure_logging
from kmipgt.malloc import ALLOCATORS, retain_freed_memory, use_allocator

# Exit status of a bad command line, option, config or input file; anything else that fails exits 1.
USAGE_ERROR = 2
INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, ImportError)
# 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C.
INTERRUPTED = 130

DESCRIPTION = """\
kmipgt trains graph transformers with k-MIP attention (each query attends to the k keys of its graph with
the largest inner product, found exactly) on PyTorch Geometric data, and measures them.

  kmipgt train                          the main job: GPS + k-MIP on the embedded Minnesota road network
  kmipgt train --config NAME            another shipped config (kmipgt configs lists them) or a YAML file
  kmipgt eval RUN_DIR                   re-evaluate a trained run
  kmipgt sweep NAME                     train every cell of a grid of configs and summarise
  kmipgt configs                        the shipped run configs and sweeps, each with what it is
  kmipgt data list                      the datasets, all usable offline
  kmipgt analysis explain RUN_DIR       which keys a trained model attends to (and other inspections)
  kmipgt bench attention                time and memory of k-MIP against full attention (and other benchmarks)

Each command has its own --help.
"""


def _no_default(action: argparse.Action) -> bool:
    return action.default is None or action.default is False or action.default == []  # `is`: 0 == False


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says it or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if _no_default(action) or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and action.option_strings and not _no_default(action):
            action = copy.copy(action)
            action.help = "(default: %(default)s)"
        return super()._format_action(action)


class _TopHelpFormatter(argparse.RawDescriptionHelpFormatter, _HelpFormatter):
    """Keeps the line breaks of the description (its command table)."""


class _Parser(argparse.ArgumentParser):
    """argparse with the one-line ``kmipgt: error: ...`` of every other CLI error (exit 2), and defaults
    in every command's help."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"kmipgt: error: {message} (see {self.prog} --help)\n")


def _config_from_args(config_class, args: argparse.Namespace, **values):
    """A dataclass config whose fields not given in ``values`` are the same-named CLI options."""
    from dataclasses import fields

    options = {f.name: getattr(args, f.name) for f in fields(config_class) if hasattr(args, f.name)}
    return config_class(**{**options, **values})


def _load_config(path, overrides: list[str] | tuple[str, ...] = ()):
    """The run config at ``path`` with ``overrides``, its ``allocator`` applied before any data are built."""
    from kmipgt.train import load_config

    config = load_config(path, overrides)
    use_allocator(config.allocator)
    return config


def _use_run_allocator(run_dir: Path, overrides: list[str] | tuple[str, ...] = ()) -> None:
    """Apply the ``allocator`` of a run's saved config before the run's data are loaded (a directory
    without ``config.yaml`` is left to the loader's own error)."""
    path = Path(run_dir) / "config.yaml"
    if path.is_file():
        _load_config(path, overrides)


def _csv(kind):
    """argparse type of a non-empty comma-separated list of ``kind`` values (``--n ,,,`` is an error)."""

    def parse(text: str) -> list:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}")
        try:
            return [kind(item) for item in items]
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__} values, got {text!r}") from error

    return parse


def _hop_range(text: str) -> tuple[int, int]:
    """``"5"`` -> (5, 5), ``"5-8"`` -> (5, 8): a range of hop counts, inclusive, 1 <= lo <= hi."""
    message = f"expected hop ranges like 1,2-4,5-8 (1 <= lo <= hi), got {text!r}"
    lo, dash, hi = text.partition("-")
    try:
        bounds = (int(lo), int(hi) if dash else int(lo))
    except ValueError as error:
        raise argparse.ArgumentTypeError(message) from error
    if not 1 <= bounds[0] <= bounds[1]:
        raise argparse.ArgumentTypeError(message)
    return bounds


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from error
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _bench_attention(args: argparse.Namespace) -> int:
    from kmipgt.bench.attention import AttentionBenchConfig, markdown_table, run_attention_benchmark
    from kmipgt.bench.common import geometric_grid

    config = _config_from_args(
        AttentionBenchConfig,
        args,
        n_values=args.n or geometric_grid(args.n_min, args.n_max),
    )
    result = run_attention_benchmark(config, args.out)
    print(markdown_table(result))
    print(f"wrote {args.out / 'attention.json'} and {args.out / 'attention.png'}")
    return 0


def _add_sizes(parser: argparse.ArgumentParser, n_min: int, n_max: int, min_help: str, max_help: str) -> None:
    parser.add_argument("--n-min", type=int, default=n_min, help=min_help)
    parser.add_argument("--n-max", type=int, default=n_max, help=max_help)
    parser.add_argument("--n", type=_csv(int), default=None, help="explicit comma-separated N values")


def _add_run_options(parser: argparse.ArgumentParser, repeats: int, time_budget: float, out: Path) -> None:
    """Options every isolated-point benchmark config shares (same names as its fields)."""
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16", "float64"])
    parser.add_argument("--time-budget", type=float, default=time_budget, help="seconds per point, all runs")
    parser.add_argument("--memory-budget-gb", type=float, default=16.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=out)


def _add_bench_attention(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser("attention", help="time and memory of k-MIP vs full attention as N grows")
    _add_sizes(parser, 1024, 262_144, "smallest N (nodes per graph)", "largest N (grid doubles from --n-min)")
    parser.add_argument("--methods", type=_csv(str), default=["kmip", "full", "full-naive"])
    parser.add_argument(
        "--backends",
        type=_csv(str),
        default=["auto"],
        help="k-MIP search backends (default auto, the library's: fused on CPU, triton on CUDA, else torch)",
    )
    parser.add_argument("--passes", type=_csv(str), default=["forward", "forward+backward"])
    parser.add_argument("--graphs", type=int, default=1, help="B graphs of N nodes each")
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=32, help="query/key head dimension d")
    parser.add_argument("--dim-v", type=int, default=32, help="value head dimension")
    parser.add_argument("-k", "--k", type=int, default=16)
    _add_run_options(parser, repeats=3, time_budget=120.0, out=Path("bench-out"))
    parser.set_defaults(handler=_bench_attention)


def _bench_search(args: argparse.Namespace) -> int:
    from kmipgt.bench.common import geometric_grid
    from kmipgt.bench.search import (
        SearchBenchConfig,
        default_backends,
        run_search_benchmark,
        search_markdown_table,
    )

    config = _config_from_args(
        SearchBenchConfig,
        args,
        n_values=args.n or geometric_grid(args.n_min, args.n_max, factor=4.0),
        backends=args.backends or default_backends(args.device),
        gemm=not args.no_gemm,
    )
    result = run_search_benchmark(config, args.out)
    print(search_markdown_table(result))
    print(f"wrote {args.out / 'search.json'} and {args.out / 'search.png'}")
    return 0


def _add_bench_search(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser("search", help="time, memory and recall@k of the key-search backends vs N")
    _add_sizes(parser, 4096, 1_048_576, "smallest N (nodes of the graph)", "largest N (grid ×4 from --n-min)")
    parser.add_argument("--backends", type=_csv(str), default=None, help="default: all available here")
    parser.add_argument("--no-gemm", action="store_true", help="skip the square-GEMM floor series")
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--dim", type=int, default=32, help="query/key head dimension d")
    parser.add_argument("-k", "--k", type=int, default=16)
    parser.add_argument("--nlist", type=int, default=None, help="IVF lists (ivf, faiss); default ~2·sqrt(N)")
    parser.add_argument("--nprobe", type=int, default=None, help="IVF lists probed (ivf, faiss)")
    parser.add_argument(
        "--recall", type=float, default=None, help="ivf: calibrate nprobe per index to this recall@k target"
    )
    parser.add_argument(
        "--clusters", type=int, default=None, help="queries and keys around this many centres (not Gaussian)"
    )
    parser.add_argument(
        "--tokens", default=None, help="query/key tokens saved by `kmipgt train --save-tokens`"
    )
    parser.add_argument("--recall-queries", type=int, default=1024, help="queries sampled for recall@k")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: one per core)")
    _add_run_options(parser, repeats=2, time_budget=300.0, out=Path("bench-out/search"))
    parser.set_defaults(handler=_bench_search)


def _approx_inputs(args: argparse.Namespace):
    """Load the run and check the grid and its k-MIP layers (ValueError/FileNotFoundError naming them)."""
    from kmipgt.analysis.tokens import kmip_layers
    from kmipgt.bench.approx import k_grid
    from kmipgt.train import load_run, split_graph

    _use_run_allocator(args.run_dir)
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


def _add_bench_approx(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser(
        "approx", help="how well a trained run's k-MIP layers approximate full attention, vs k"
    )
    parser.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    parser.add_argument(
        "--k", type=_csv(int), default=None, help="comma-separated k grid (default 1, 2, 4, ..., N)"
    )
    parser.add_argument("--split", default="test", help="split whose graph gives the tokens")
    parser.add_argument("--graph", type=int, default=0, help="graph of the split (graph/edge-level runs)")
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best")
    parser.add_argument("--save-tokens", action="store_true", help="also save q/k/v of every layer")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/approx)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    _add_trust_checkpoint(parser, "the checkpoint")
    parser.set_defaults(handler=_bench_approx, config_allocator=True)


def _loader_option(text: str) -> tuple[str, object]:
    """argparse type of ``KEY=VALUE``, the value read as YAML like a config's ``data.options``."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _data_list(args: argparse.Namespace) -> int:
    from kmipgt.data import DATASETS

    for dataset in DATASETS.values():
        extra = f" (extra: {dataset.extra})" if dataset.extra else ""
        print(f"{dataset.name:<15} {'/'.join(dataset.levels):<10} {dataset.description}{extra}")
    return 0


def _data_info(args: argparse.Namespace) -> int:
    from kmipgt.data import get_dataset
    from kmipgt.data.report import graph_set_summary, graph_summary

    flags = {"root": args.root, "num_nodes": args.num_nodes, "seed": args.seed}
    options = {**{key: value for key, value in flags.items() if value is not None}, **dict(args.options)}
    try:
        dataset = get_dataset(args.name)
        if "node" not in dataset.levels:
            raise ValueError(f"dataset {args.name!r} is a set of graphs; info summarises one graph")
        data = dataset.load(**options)
    except (FileNotFoundError, ImportError, ValueError) as error:
        print(f"kmipgt data info: {error}", file=sys.stderr)
        return 2
    summary = graph_set_summary(data) if isinstance(data, dict) else graph_summary(data)
    for key, value in summary.items():
        print(f"{key}: {value}")
    return 0


def _data_synthetic(args: argparse.Namespace) -> int:
    import torch

    from kmipgt.data.report import graph_summary, timed_synthetic_city

    data, timings = timed_synthetic_city(
        args.num_nodes,
        args.seed,
        arterial_fraction=args.arterial_fraction,
        num_edges=args.num_edges,
        labels=not args.no_labels,
        hops=args.hops,
        num_workers=args.workers,
        backend=args.backend,
        rwse_steps=args.rwse,
        lappe_k=args.lappe,
    )
    for key, value in graph_summary(data).items():
        print(f"{key}: {value}")
    for stage, (wall, cpu) in timings.items():
        print(f"time {stage}: {wall:.1f} s wall, {cpu:.1f} s CPU")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, args.out)
        print(f"wrote {args.out}")
    return 0


def _add_data(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="offline datasets").add_subparsers(
        dest="data_command", required=True
    )
    data.add_parser("list", help="the registered datasets (a config's data.name)").set_defaults(
        handler=_data_list
    )
    info = data.add_parser("info", help="load a dataset and print its statistics")
    info.add_argument("name", help="a registered dataset (kmipgt data list), e.g. minnesota")
    info.add_argument("--root", type=Path, default=None, help="directory of a local copy (root option)")
    info.add_argument("--num-nodes", type=int, default=None, help="size of a synthetic city")
    info.add_argument("--seed", type=int, default=None, help="seed of a synthetic city")
    info.add_argument(
        "--set", dest="options", metavar="KEY=VALUE", type=_loader_option, action="append", default=[],
        help="another loader option, as in a config's data.options, e.g. --set name=paris (repeatable)",
    )
    info.set_defaults(handler=_data_info)
    synthetic = data.add_parser("synthetic", help="generate (and label) a synthetic city, timing each stage")
    synthetic.add_argument("--num-nodes", type=int, required=True)
    synthetic.add_argument("--seed", type=int, default=0)
    synthetic.add_argument(
        "--arterial-fraction",
        type=float,
        default=1e-3,
        help="hubs per node of the arterial network (smaller -> larger hop diameter)",
    )
    synthetic.add_argument(
        "--num-edges", type=int, default=None, help="exact number of undirected roads (default: the recipe's)"
    )
    synthetic.add_argument("--hops", type=int, default=16, help="ball radius of the labels")
    synthetic.add_argument("--no-labels", action="store_true", help="skip the (slow) eccentricity labels")
    synthetic.add_argument("--workers", type=int, default=None, help="label worker processes (default: all)")
    synthetic.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "numba", "scipy"],
        help="label kernel: numba (when installed) or scipy; same results",
    )
    synthetic.add_argument("--rwse", type=int, default=0, help="add RWSE with this many steps (0: none)")
    synthetic.add_argument("--lappe", type=int, default=0, help="add LapPE with this many vectors (0: none)")
    synthetic.add_argument("--out", type=Path, default=None, help="torch.save the Data to this .pt file")
    synthetic.set_defaults(handler=_data_synthetic)


def _train(args: argparse.Namespace) -> int:
    config = _load_config(args.config, [*args.overrides, *(["tensorboard=true"] if args.tensorboard else [])])
    from kmipgt.train import train

    try:
        metrics = train(
            config,
            resume=args.resume,
            stop_after=args.stop_after,
            save_tokens=args.save_tokens,
            progress=not args.no_progress,
            overwrite=args.overwrite,
            trust_checkpoint=args.trust_checkpoint,
        )
    except KeyboardInterrupt:
        print(f"kmipgt: {_interrupted(config, args)}", file=sys.stderr)
        return INTERRUPTED
    print(json.dumps(metrics, indent=2))
    if metrics.get("complete"):
        print(f"test {metrics['metric']}: {metrics['test']:.4f}  (run directory: {config.out_dir})")
    elif "epochs_done" in metrics:
        print(f"stopped after epoch {metrics['epochs_done']} of {config.optim.epochs}; continue with: "
              f"{_resume_command(config, args)}")
    return 0


def _resume_command(config, args: argparse.Namespace) -> str:
    """The command that continues the run in ``config.out_dir``: its saved config.yaml holds every setting
    (the resolved thread count included), so no override needs repeating."""
    flags = [flag for flag, given in (("--save-tokens", args.save_tokens),
                                      ("--trust-checkpoint", args.trust_checkpoint)) if given]
    saved = str(Path(config.out_dir) / "config.yaml")
    return shlex.join(["kmipgt", "train", "--config", saved, "--resume", *flags])


def _interrupted(config, args: argparse.Namespace) -> str:
    """One line on a run stopped by Ctrl-C: the epoch that ``last.pt`` keeps and how to continue."""
    from kmipgt.train.checkpoint import load_checkpoint

    try:
        state = load_checkpoint(Path(config.out_dir) / "last.pt", ("state",), trust=args.trust_checkpoint)
    except (FileNotFoundError, ValueError):
        return "interrupted before an epoch was saved: nothing to resume; start again with --overwrite"
    epoch = state["state"]["epoch"]
    return (f"interrupted in epoch {epoch + 1} of {config.optim.epochs} (last.pt keeps epoch {epoch}); "
            f"continue with: {_resume_command(config, args)}")


def _eval(args: argparse.Namespace) -> int:
    import json

    from kmipgt.train import evaluate_run

    _use_run_allocator(args.run_dir, args.overrides)
    metrics = evaluate_run(
        args.run_dir, args.checkpoint, args.overrides, save_tokens=args.save_tokens,
        trust_checkpoint=args.trust_checkpoint,
    )
    print(json.dumps(metrics, indent=2))
    return 0


def _add_trust_checkpoint(parser: argparse.ArgumentParser, which: str) -> None:
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help=f"also read NumPy arrays of numbers in {which}, as the last.pt of kmipgt 0.1.0 holds (its RNG "
        "states); checkpoints are read weights-only either way, so no code in them runs",
    )


def _add_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config key, e.g. --set {example} (repeatable)",
    )


def _add_train_eval(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a graph transformer from a YAML config")
    train.add_argument(
        "--config",
        default="minnesota",
        help="YAML config: a path, or a shipped config's name (kmipgt configs) (default: minnesota, the main "
        "job, what make demo runs)",
    )
    _add_overrides(train, "model.k=32")
    again = train.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from out_dir/last.pt")
    again.add_argument(
        "--overwrite", action="store_true", help="replace the run already in out_dir (its files are deleted)"
    )
    train.add_argument(
        "--stop-after",
        type=_positive_int,
        default=None,
        metavar="EPOCH",
        help="stop after this epoch (continue later with --resume)",
    )
    _add_trust_checkpoint(train, "the last.pt of --resume")
    train.add_argument(
        "--save-tokens",
        action="store_true",
        help="after training, save the first attention layer's query/key tokens to tokens.pt",
    )
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write scalars to out_dir/tensorboard (extra: tensorboard)",
    )
    train.set_defaults(handler=_train, config_allocator=True)
    evaluate = commands.add_parser("eval", help="evaluate a trained run on every split")
    evaluate.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    evaluate.add_argument("--checkpoint", choices=("best", "last"), default="best")
    _add_overrides(evaluate, "data.options.num_nodes=262144 (applied to the run's saved config)")
    evaluate.add_argument(
        "--save-tokens",
        action="store_true",
        help="also save the first attention layer's query/key tokens to out_dir/tokens.pt",
    )
    _add_trust_checkpoint(evaluate, "the checkpoint")
    evaluate.set_defaults(handler=_eval, config_allocator=True)


def _sweep(args: argparse.Namespace) -> int:
    import shlex

    from kmipgt.sweep import cell_dir, cell_state, expand, load_sweep, run_sweep, write_reports

    sweep = load_sweep(args.sweep, out=args.out, overrides=args.overrides)
    cells = expand(sweep)
    if args.dry_run:
        print(f"{len(cells)} cells of {sweep.path} (base {sweep.base}) in {sweep.out}:")
        for cell in cells:
            print(f"  {cell.label}  [{cell_state(sweep, cell)}]  {cell_dir(sweep, cell)}")
        return 0
    print(f"{len(cells)} cells, {args.jobs} at a time, in {sweep.out}")
    rows = run_sweep(sweep, jobs=args.jobs)
    options = [f"--jobs={args.jobs}", f"--out={sweep.out}", *(f"--set={text}" for text in args.overrides)]
    command = shlex.join(["kmipgt", "sweep", str(args.sweep), *options])
    write_reports(sweep, rows, command)
    failed = sum(row["status"] != "ok" for row in rows)
    print(f"wrote {sweep.out / 'results.csv'}, summary.md, summary.csv, summary.png; {failed} cells failed")
    return 1 if failed else 0


def _add_sweep(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("sweep", help="train each cell of a grid of config overrides; summarise")
    parser.add_argument(
        "sweep", type=Path, help="sweep YAML (a path or a shipped name, e.g. sweeps/influence_of_k)"
    )
    parser.add_argument("--jobs", type=int, default=1, help="cells trained at once, each in its own process")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the file's out)")
    _add_overrides(parser, "optim.epochs=20 (added to the file's set, for every cell)")
    parser.add_argument("--dry-run", action="store_true", help="list the cells and their state, then exit")
    parser.set_defaults(handler=_sweep)


def _bench_grf(args: argparse.Namespace) -> int:
    from kmipgt.bench.grf import GRFBenchConfig, run_grf_benchmark

    chosen = {"methods": tuple(args.methods)} if args.methods else {}
    config = _config_from_args(GRFBenchConfig, args, **chosen)
    result = run_grf_benchmark(config, args.out)
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
    parser.add_argument(
        "--methods",
        type=_csv(str),
        default=None,
        help="comma-separated subset of grf,grf_mask,grf_asym,linear,dense,grf_layer,linear_layer "
        "(default: all)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed forwards per point (minimum reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per measurement")
    parser.add_argument("--time-budget", type=float, default=600.0, help="seconds per point before time-out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="bench-out/grf", help="folder for grf.json and grf.png")
    parser.set_defaults(handler=_bench_grf)


def _bench_memory(args: argparse.Namespace) -> int:
    from kmipgt.train.memory import memory_breakdown
    from kmipgt.train.report import write_json

    result = memory_breakdown(_load_config(args.config, args.overrides))
    for view in ("state_mib", "saved_mib"):
        for name, mib in result[view].items():
            print(f"{view[:-4]:>6}  {name:<48} {mib:10.1f} MiB")
    for phase, rss in result["rss_mib"].items():
        print(f"   rss  {phase:<48} {rss['peak_mib']:10.1f} MiB peak, {rss['end_mib']:.1f} at its end")
    if args.out is not None:
        write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


def _add_bench_memory(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser(
        "memory", help="one full-batch training step: state, saved-for-backward bytes per component, RSS"
    )
    parser.add_argument("--config", required=True, help="a node-level run config (path or shipped name)")
    _add_overrides(parser, "data.options.num_nodes=100000")
    parser.add_argument("--out", type=Path, default=None, help="also write the result to this JSON file")
    parser.set_defaults(handler=_bench_memory, config_allocator=True)


def _bench_train(args: argparse.Namespace) -> int:
    from kmipgt.bench.common import geometric_grid
    from kmipgt.bench.train import TrainBenchConfig, run_train_benchmark

    n_values = sorted({*geometric_grid(args.n_min, args.n_max, args.factor), args.n_max})
    config = TrainBenchConfig(
        n_values=n_values, methods=args.methods, config=args.config, epochs=args.epochs,
        threads=args.threads, time_budget=args.time_budget, memory_budget_gb=args.memory_budget_gb,
        allocator=args.allocator, overrides=args.overrides,
        **({} if args.edges_per_node is None else {"edges_per_node": args.edges_per_node}),
    )
    result = run_train_benchmark(config, args.out)
    for record in result["points"]:
        if record["status"] != "ok":
            print(f"{record['method']:>10} N={record['n']:>7}  {record['status']}: {record['reason']}")
        else:
            print(f"{record['method']:>10} N={record['n']:>7}  {record['time_per_epoch']:9.1f} s/epoch  "
                  f"{record['peak_memory_bytes'] / 2**20:9.1f} MiB")
    print(json.dumps(result["slopes"], indent=2))
    print(f"wrote {args.out}/train.json and {args.out}/train.png")
    return 0


def _add_bench_train(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser("train", help="time per epoch and peak RSS of full-batch training vs N")
    parser.add_argument("--config", default="synthetic_london", help="run config (path or shipped name)")
    parser.add_argument("--n-min", type=int, default=50000)
    parser.add_argument("--n-max", type=int, default=568795, help="largest N (always measured if in budget)")
    parser.add_argument("--factor", type=float, default=2.0, help="ratio between successive N")
    parser.add_argument("--methods", type=_csv(str), default=["none", "kmip_ivf"],
                        help="comma-separated subset of none,kmip_exact,kmip_ivf,grf")
    parser.add_argument("--edges-per-node", type=float, default=None,
                        help="undirected roads per node (default: London's 1.33; 0: the generator's own)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs per point; the first is timed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--time-budget", type=float, default=3600.0, help="seconds per point")
    parser.add_argument("--memory-budget-gb", type=float, default=16.0, help="peak RSS per point")
    parser.add_argument("--allocator", choices=ALLOCATORS, default="live",
                        help="config key `allocator` of every point (heap policy, kmipgt.malloc)")
    _add_overrides(parser, "model.num_layers=4")
    parser.add_argument("--out", type=Path, default=Path("bench-out/train"), help="folder of train.json/.png")
    parser.set_defaults(handler=_bench_train)


def _bench_step(args: argparse.Namespace) -> int:
    from kmipgt.bench.common import write_json
    from kmipgt.train.step_time import markdown_table, step_breakdown

    settings = [*args.overrides, f"threads={args.threads}"]
    if args.device is not None:
        settings.append(f"device={args.device}")
    result = step_breakdown(_load_config(args.config, settings), steps=args.steps, warmup=args.warmup)
    result = {"config": args.config, "overrides": args.overrides, **result}
    table = markdown_table(result)
    batch = result["batch"]
    print(f"{args.config} on {result['device']} ({result['threads']} threads, torch {result['torch']}): "
          f"{batch['graphs']} graphs, {batch['nodes']} nodes, {batch['edges']} edges per step; "
          f"median of {args.steps} steps")
    print(table)
    write_json(result, args.out / "step.json")
    (args.out / "step.md").write_text(table + "\n")
    print(f"wrote {args.out / 'step.json'} and {args.out / 'step.md'}")
    return 0


def _add_bench_step(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser(
        "step", help="one training step of a config on stand-in data: data, attention, MPNN and the rest"
    )
    parser.add_argument("--config", required=True, help="run config (path or shipped name)")
    _add_overrides(parser, "model.attention=none")
    parser.add_argument("--steps", type=_positive_int, default=5, help="timed steps (medians reported)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first")
    parser.add_argument("--threads", type=_positive_int, default=1, help="torch CPU threads")
    parser.add_argument("--device", default=None, help="torch device (default: the config's `device`)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/step"), help="folder of step.json/.md")
    parser.set_defaults(handler=_bench_step, config_allocator=True)


def _bench_ragged(args: argparse.Namespace) -> int:
    from kmipgt.bench.ragged import RaggedBenchConfig, markdown_table, run_ragged_benchmark

    config = _config_from_args(RaggedBenchConfig, args)
    result = run_ragged_benchmark(config, args.out)
    batch = result["batch"]
    print(f"{config.graphs} graphs, {batch['nodes']:,} nodes (largest {batch['largest_graph']}) on "
          f"{config.device}, {config.threads} thread(s); median of {config.repeats} interleaved rounds")
    print(markdown_table(result))
    print(f"wrote {args.out / 'ragged.json'} and {args.out / 'ragged.png'}")
    return 0


def _add_bench_ragged(bench: argparse._SubParsersAction) -> None:
    parser = bench.add_parser(
        "ragged", help="k-MIP and full attention on a batch of small graphs vs one padded SDPA call"
    )
    # Same names and defaults as RaggedBenchConfig's fields; its module imports torch, which --help and
    # every other command do without.
    parser.add_argument("--graphs", type=int, default=200, help="graphs in the batch")
    parser.add_argument("--min-nodes", type=int, default=100, help="smallest graph (uniform sizes)")
    parser.add_argument("--max-nodes", type=int, default=199, help="largest graph")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=19, help="channels per head")
    parser.add_argument("-k", "--k", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--repeats", type=int, default=10, help="interleaved timed rounds")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=Path("bench-out/ragged"), help="folder of ragged.json and ragged.png"
    )
    parser.set_defaults(handler=_bench_ragged)


def _layer_or_all(text: str) -> int | None:
    return None if text == "all" else int(text)


def _graph_or_all(text: str) -> int | str:
    return text if text == "all" else int(text)


def _explain_inputs(args: argparse.Namespace):
    """Load the run and check every option against it (ValueError/FileNotFoundError naming the value)."""
    from kmipgt.analysis import check_queries, sample_queries, select_layers_heads
    from kmipgt.data import virtual_node_mask
    from kmipgt.train import load_run, split_graph

    if args.graph == "all" and args.nodes is not None:
        raise ValueError("--nodes names queries of one graph; --graph all writes statistics only")
    _use_run_allocator(args.run_dir)
    trainer = load_run(args.run_dir, args.checkpoint, trust_checkpoint=args.trust_checkpoint)
    select_layers_heads(trainer.model, args.layer, args.head)
    if args.graph == "all" and trainer.task.level != "graph":
        raise ValueError(f"--graph all needs a graph-level run, this one is {trainer.task.level}-level")
    part = split_graph(trainer, args.split, 0 if args.graph == "all" else args.graph)
    if args.graph == "all":
        return trainer, part, None
    if args.nodes is not None:
        if not args.nodes:
            raise ValueError("--nodes lists no node")
        queries = check_queries(args.nodes, part.graph.num_nodes)
    else:
        nodes = part.nodes
        if trainer.config.data.virtual_node:
            nodes = nodes[~virtual_node_mask(part.graph)[nodes].cpu()]
        queries = sample_queries(nodes, args.sample, args.seed)
    return trainer, part, queries


def _analysis_explain(args: argparse.Namespace) -> int:
    from kmipgt.analysis import explain, explain_graphs, undirected_adjacency
    from kmipgt.analysis.plots import plot_explanation, plot_stats
    from kmipgt.train.report import write_json

    trainer, part, queries = _explain_inputs(args)
    options = {
        "k": trainer.config.model.k, "layer": args.layer, "head": args.head, "seed": args.seed,
        "virtual_node": trainer.config.data.virtual_node,
    }
    progress = not args.no_progress
    if queries is None:
        batches = trainer.task.eval_batches(args.split)
        result = explain_graphs(trainer.model, batches, progress=progress, **options)
    else:
        result = explain(
            trainer.model, part.graph, part.nodes, queries, labels=part.labels,
            train_mask=part.train_mask, progress=progress, **options,
        )
    run = {"run": str(args.run_dir), "split": args.split, "graph": args.graph, "dataset": trainer.data.name}
    result = {**run, **result}
    out = args.out if args.out is not None else args.run_dir / "explain"
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "explain.json", result)
    if queries is None:
        plot_stats(out / "explain_stats.png", result)
        paths = [out / "explain_stats.png"]
    else:
        coords = None if part.coords is None else part.coords.double().cpu().numpy()
        adjacency = undirected_adjacency(part.graph.edge_index, part.graph.num_nodes)
        paths = plot_explanation(out, result, adjacency, coords)
    model = trainer.config.model
    # Beyond this many hops no message-passing layer of the model reaches a key.
    _print_explain_summary(result, reach=model.num_layers if model.local != "none" else 0)
    print(f"wrote {out / 'explain.json'} and {', '.join(path.name for path in paths)}")
    return 0


def _print_explain_summary(result: dict, reach: int) -> None:
    """A markdown table: per layer (mean and range over heads) and per reference."""
    from kmipgt.analysis import summary_rows

    graphs = f" in {result['num_graphs']} graphs" if result["num_graphs"] > 1 else ""
    print(f"{result['num_queries']} queries{graphs} of split {result['split']!r}, k = {result['k']}; "
          "mean (min-max over heads)")
    rows = summary_rows(result, reach)
    columns = {
        "mean_hops": "mean hops", "beyond": f"weight beyond {reach} hops", "entropy": "entropy (nats)",
        "distinct_per_graph": "distinct keys per graph", "virtual": "weight on the virtual node",
    }
    if not any(row["virtual"] for row in rows):
        del columns["virtual"]
    print(f"| | {' | '.join(columns.values())} |")
    print(f"|---|{'---|' * len(columns)}")
    for row in rows:
        print(f"| {row['name']} | {' | '.join(_spread_text(row[key]) for key in columns)} |")


def _spread_text(spread: tuple[float, float, float] | None) -> str:
    if spread is None:
        return "-"
    mean, low, high = spread
    number = "{:,.0f}".format if high >= 1000 else "{:.3g}".format
    return number(mean) if low == high else f"{number(mean)} ({number(low)}-{number(high)})"


def _analysis_curves(args: argparse.Namespace) -> int:
    from kmipgt.train import load_config
    from kmipgt.train.metrics import higher_is_better
    from kmipgt.train.report import best_evaluation, plot_comparison, read_history

    names = [run.name for run in args.runs]
    # Runs that share a label share a colour, as seeds of one model: a name clash must not pose as one.
    labels = args.labels or (names if len(set(names)) == len(names) else [str(run) for run in args.runs])
    if len(labels) != len(args.runs):
        raise ValueError(f"--labels names {len(labels)} runs, {len(args.runs)} are given")
    histories = [read_history(run) for run in args.runs]
    metrics = {load_config(run / "config.yaml").task.metric for run in args.runs}
    if len(metrics) > 1:
        raise ValueError(f"the runs report different metrics: {', '.join(sorted(metrics))}")
    (metric,) = metrics
    print(f"| run | label | epochs | best epoch | val {metric} | test {metric} |\n|---|---|---|---|---|---|")
    for run, label, history in zip(args.runs, labels, histories, strict=True):
        best = best_evaluation(history, higher_is_better(metric)) or {}
        columns = (("epoch", 0), ("val", 4), ("test", 4))
        cells = [_number_or_dash(best.get(key), digits) for key, digits in columns]
        print(f"| {run} | {label} | {len(history)} | {' | '.join(cells)} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot_comparison(args.out, list(zip(labels, histories, strict=True)), metric)
    print(f"wrote {args.out}")
    return 0


def _number_or_dash(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _analysis_probe(args: argparse.Namespace) -> int:
    from kmipgt.analysis import label_agreement_by_hops, neighbourhood_probe
    from kmipgt.train.datasets import node_coords, prepare_data

    config = _load_config(args.config, args.overrides)
    if config.task.level != "node":
        print(
            f"kmipgt: error: the probe needs a node-level task, got task.level={config.task.level!r}",
            file=sys.stderr,
        )
        return 2
    graph = prepare_data(config).graph
    rows = neighbourhood_probe(
        graph.x,
        graph.y,
        graph.edge_index,
        graph.train_mask,
        graph.test_mask,
        node_coords(graph, config.model.coord_columns),
        hops=tuple(args.hops),
        spatial_k=tuple(args.spatial),
        label_k=tuple(args.label_k),
    )
    print("| features | test accuracy |\n|---|---|")
    for name, accuracy in rows.items():
        print(f"| {name} | {accuracy:.3f} |")
    agreement = label_agreement_by_hops(graph.y, graph.edge_index, tuple(args.rings), args.pairs_from)
    print("\n| hops apart | pairs with the same label | expected from their label mix |\n|---|---|---|")
    for name, (same, expected) in agreement.items():
        print(f"| {name} | {same:.3f} | {expected:.3f} |")
    if args.out is not None:
        same_label = {name: {"same": same, "expected": mix} for name, (same, mix) in agreement.items()}
        record = {"config": str(args.config), "overrides": args.overrides, **rows, "same_label": same_label}
        args.out.write_text(json.dumps(record, indent=2))
    return 0


def _analysis_wl(args: argparse.Namespace) -> int:
    from kmipgt.analysis.seg_wl import load_graph, seg_wl

    graphs = [load_graph(path) for path in (args.first, args.second)]
    result = seg_wl(graphs, args.encoding, rwse_steps=args.rwse_steps, features=not args.no_features)
    sizes = " and ".join(f"{g.num_nodes} nodes" for g in graphs)
    rounds = f"stable after {result.rounds} round{'s' * (result.rounds != 1)}, {result.num_colours} colours"
    print(f"S-SEG-WL ({args.encoding}) on {sizes}: {rounds}")
    print("distinguished" if result.distinguished else "not distinguished")
    return 0


def _add_analysis(commands: argparse._SubParsersAction) -> None:
    analysis = commands.add_parser("analysis", help="inspect trained models").add_subparsers(
        dest="analysis_command", required=True
    )
    parser = analysis.add_parser(
        "explain", help="which keys k-MIP (or full) attention attends to, with hop and label statistics"
    )
    parser.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--nodes", type=_csv(int), default=None, help="comma-separated query node ids")
    chosen.add_argument("--sample", type=int, default=8, help="random queries of the split")
    parser.add_argument("--split", default="test", help="train, val or test (statistics run over it)")
    parser.add_argument("--graph", type=_graph_or_all, default=0,
                        help="graph of the split (graph/edge-level runs); all: statistics over every graph "
                             "of a graph-level split")
    parser.add_argument("--layer", type=_layer_or_all, default=None, help="all (default) or a layer index")
    parser.add_argument("--head", type=_layer_or_all, default=None, help="all (default) or a head index")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample and of the uniform reference")
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/explain)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    _add_trust_checkpoint(parser, "the checkpoint")
    parser.set_defaults(handler=_analysis_explain, config_allocator=True)
    probe = analysis.add_parser(
        "probe", help="linear probe: label signal in hop neighbourhoods vs spatial neighbourhoods"
    )
    probe.add_argument("--config", type=Path, required=True, help="run config naming the dataset")
    _add_overrides(probe, "data.options.num_nodes=20000")
    probe.add_argument("--hops", type=_csv(int), default=[0, 2, 4, 8, 16], help="hop counts")
    probe.add_argument(
        "--spatial", type=_csv(int), default=[16, 64, 256, 1024], help="spatial neighbourhood sizes"
    )
    probe.add_argument(
        "--label-k", type=_csv(int), default=[1, 5, 15],
        help="training nodes voting in the nearest-labels rows (their labels, no features)",
    )
    probe.add_argument(
        "--rings", type=_csv(_hop_range), default=[(1, 1), (2, 4), (5, 8), (9, 16), (17, 32)],
        help="hop ranges of the same-label rows: how often nodes that far apart share a label",
    )
    probe.add_argument(
        "--pairs-from", type=_positive_int, default=2000,
        help="source nodes the same-label rows count pairs from",
    )
    probe.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    probe.set_defaults(handler=_analysis_probe, config_allocator=True)
    curves = analysis.add_parser(
        "curves", help="several runs' training loss and validation metric on one plot, best epochs as a table"
    )
    curves.add_argument("runs", type=Path, nargs="+", help="run directories written by kmipgt train")
    curves.add_argument(
        "--labels", type=_csv(str), default=None,
        help="comma-separated label per run (default: folder names); runs sharing a label share a colour",
    )
    curves.add_argument("--out", type=Path, default=Path("curves.png"), help="the plot (default curves.png)")
    curves.set_defaults(handler=_analysis_curves)
    wl = analysis.add_parser(
        "wl", help="S-SEG-WL test: can GraphGPS with this structural encoding tell two graphs apart?"
    )
    wl.add_argument("first", type=Path, help="a PyG Data saved with torch.save")
    wl.add_argument("second", type=Path, help="the other graph")
    wl.add_argument(
        "--encoding", choices=("none", "spd", "rwse"), default="spd", help="pair encoding of the refinement"
    )
    wl.add_argument("--rwse-steps", type=int, default=16, help="walk lengths of --encoding rwse")
    wl.add_argument("--no-features", action="store_true", help="ignore x: every node starts alike")
    wl.set_defaults(handler=_analysis_wl)


def _configs(args: argparse.Namespace) -> int:
    from kmipgt.configs import config_path, first_comment, list_configs

    if args.paths:
        for name in list_configs():
            print(config_path(name))
        return 0
    groups = {"run configs (kmipgt train --config NAME)": "run", "sweeps (kmipgt sweep NAME)": "sweep"}
    for number, (title, kind) in enumerate(groups.items()):
        names = list_configs(kind)
        width = max(map(len, names), default=0)
        print(f"{chr(10) if number else ''}{title}:")
        for name in names:
            print(f"  {name:<{width}}  {first_comment(name)}".rstrip())
    return 0


def _add_configs(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "configs", help="list the shipped configs (train --config NAME and sweep NAME find them by name)"
    )
    parser.add_argument("--paths", action="store_true", help="print only each config's file path")
    parser.set_defaults(handler=_configs)


def build_parser() -> argparse.ArgumentParser:
    from kmipgt import __version__

    parser = _Parser(prog="kmipgt", description=DESCRIPTION, formatter_class=_TopHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kmipgt {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument(
        "-q", "--quiet", action="store_true", help="only warnings and errors (no progress bars)"
    )
    verbosity.add_argument("-v", "--verbose", action="store_true", help="also debug lines (one per epoch)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_train_eval(commands)
    _add_sweep(commands)
    _add_configs(commands)
    _add_data(commands)
    _add_analysis(commands)
    bench = commands.add_parser("bench", help="benchmarks (JSON + PNG)").add_subparsers(
        dest="benchmark", required=True
    )
    _add_bench_attention(bench)
    _add_bench_search(bench)
    _add_bench_grf(bench)
    _add_bench_approx(bench)
    _add_bench_memory(bench)
    _add_bench_train(bench)
    _add_bench_step(bench)
    _add_bench_ragged(bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command; an error prints ``kmipgt: error: <one line>`` and returns 2 (input) or 1 (runtime),
    Ctrl-C one line and 130."""
    args = build_parser().parse_args(argv)
    configure_logging(logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO)
    # Commands that read a config apply its `allocator` once it is loaded: glibc's own policy cannot be
    # restored after mallopt, so nothing may be set before. The others keep freed memory.
    if not getattr(args, "config_allocator", False):
        retain_freed_memory()
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("kmipgt: interrupted", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``kmipgt configs | head``): not an error; silence the flush at exit.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except Exception as error:
        if args.debug:
            traceback.print_exc()
        lines = str(error).strip().splitlines() or [type(error).__name__]
        print(f"kmipgt: error: {lines[0]}", file=sys.stderr)
        return USAGE_ERROR if isinstance(error, INPUT_ERRORS) else 1


if __name__ == "__main__":  # `torchrun -m kmipgt.cli train ...` as well as `python -m kmipgt`
    raise SystemExit(main())
