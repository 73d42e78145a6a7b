"""``kmipgt analysis grf``: the modulation functions trained GRF attention learned, and how well its walks
estimate the mask they stand for."""

from __future__ import annotations

import argparse
from pathlib import Path

from kmipgt.atomic import atomic_write_json
from kmipgt.cli.parser import add_checkpoint, csv, positive_int
from kmipgt.cli.runs import use_run_allocator

# Largest graph of the estimator check: the exact mask is dense, [N, N] float64 per head.
MAX_DENSE_NODES = 5000


def _analysis_grf(args: argparse.Namespace) -> int:
    from kmipgt.analysis.grf_estimator import summarize_errors
    from kmipgt.analysis.modulation import modulations, plot_modulations
    from kmipgt.train import load_run

    out = args.out if args.out is not None else args.runs[0] / "grf"
    out.mkdir(parents=True, exist_ok=True)
    figure = args.figure if args.figure is not None else out / "grf_modulation.png"
    figure.parent.mkdir(parents=True, exist_ok=True)
    runs, graph, record = {}, None, {"runs": [str(run) for run in args.runs], "estimator": []}
    # The allocator is set once per process: the first run's (seeds of one model share it).
    use_run_allocator(args.runs[0])
    for run in args.runs:
        trainer = load_run(run, args.checkpoint, trust_checkpoint=args.trust_checkpoint)
        found = runs[str(run)] = modulations(trainer.model)
        if args.walks is None:
            continue
        graph = _checked_graph(trainer, args) if graph is None else graph
        rows = _estimator_rows(trainer, found, graph, args)
        record["estimator"] += [{"run": str(run), **row} for row in rows]
    # The run folders' names as labels where they tell the runs apart (a sweep's cells), else their paths.
    names = [Path(run).name for run in runs]
    plot_modulations(figure, dict(zip(names if len(set(names)) == len(names) else runs, runs.values())))
    record["modulation"] = {
        run: [{"layer": m.name, "initial": m.initial.tolist(), "learned": m.learned.tolist()} for m in found]
        for run, found in runs.items()
    }
    _print_modulation(runs)
    if args.walks is not None:
        record["graph"] = {"split": args.split, "index": args.graph, "num_nodes": graph.num_nodes}
        record["summary"] = summarize_errors(record["estimator"])
        _print_estimator(record["summary"], graph.num_nodes, len(args.runs), args.seeds)
    atomic_write_json(out / "grf.json", record)
    print(f"wrote {figure} and {out / 'grf.json'}")
    return 0


def _checked_graph(trainer, args: argparse.Namespace):
    """The graph of the estimator check (``--split``, ``--graph``), refused above ``MAX_DENSE_NODES``."""
    from kmipgt.train import split_graph

    graph = split_graph(trainer, args.split, args.graph).graph
    if graph.num_nodes > MAX_DENSE_NODES:
        raise ValueError(
            f"graph {args.graph} of split {args.split!r} has {graph.num_nodes} nodes; the exact mask is "
            f"dense, so the estimator check takes graphs of up to {MAX_DENSE_NODES} (--modulation-only skips "
            "it)"
        )
    return graph


def _estimator_rows(trainer, found: list, graph, args: argparse.Namespace) -> list[dict]:
    """The estimator's errors for every head of every GRF layer of one run, each row naming its layer."""
    import torch

    from kmipgt.analysis.grf_estimator import estimation_errors
    from kmipgt.nn.grf_core import GRFCore

    core = next(module for module in trainer.model.modules() if isinstance(module, GRFCore))
    rows = estimation_errors(
        graph.edge_index, graph.num_nodes, torch.cat([layer.learned for layer in found]), args.walks,
        range(args.seeds), p_halt=core.p_halt, repelling=core.repelling, antithetic=core.antithetic,
    )
    heads = found[0].learned.shape[0]
    return [{**row, "layer": found[row["head"] // heads].name, "head": row["head"] % heads} for row in rows]


def _print_modulation(runs: dict) -> None:
    """f per layer (mean over runs and heads) against the initial f, one column per walk step."""
    import torch

    layers = list(zip(*runs.values(), strict=True))
    steps = layers[0][0].initial.numel()
    print(f"f_t per layer, mean over {len(runs)} run(s) and their heads\n")
    print(f"| layer | {' | '.join(f't = {t}' for t in range(steps))} |\n|---|{'---|' * steps}")
    print(f"| initial | {' | '.join(f'{value:.3f}' for value in layers[0][0].initial.tolist())} |")
    for layer in layers:
        mean = torch.cat([run.learned for run in layer]).mean(0)
        print(f"| {layer[0].name} | {' | '.join(f'{value:.3f}' for value in mean.tolist())} |")


def _print_estimator(summary: list[dict], num_nodes: int, num_runs: int, seeds: int) -> None:
    print(f"\nrelative Frobenius error on a graph of {num_nodes} nodes, mean ± std over {num_runs} run(s)' "
          f"layers and heads and {seeds} walk seed(s)\n")
    print("| walks per node | Φ̂ against Σ f_t W^t | Φ̂Φ̂ᵀ against the exact mask | nonzeros per row of Φ̂ | "
          "keys a query reaches: Φ̂Φ̂ᵀ | ΦΦᵀ |")
    print("|---|---|---|---|---|---|")
    for entry in summary:
        features = f"{entry['features_error']:.4f} ± {entry['features_error_std']:.4f}"
        mask = f"{entry['mask_error']:.4f} ± {entry['mask_error_std']:.4f}"
        reach = f"{entry['mask_nonzeros_per_row']:.1f} | {entry['exact_mask_nonzeros_per_row']:.1f}"
        print(f"| {entry['num_walks']} | {features} | {mask} | {entry['nonzeros_per_row']:.1f} | {reach} |")


def add_grf(analysis: argparse._SubParsersAction) -> None:
    parser = analysis.add_parser(
        "grf", help="the modulation f that trained GRF attention learned (a figure per layer) and the error "
                    "of its walks' mask estimate against the exact mask, as the walks per node grow",
    )
    parser.add_argument("runs", type=Path, nargs="+", help="run directories of GRF models (e.g. the seeds)")
    parser.add_argument("--split", default="test", help="split of the graph the estimator is checked on")
    parser.add_argument("--graph", type=int, default=0, help="graph of the split (graph-level data)")
    walks = parser.add_mutually_exclusive_group()
    walks.add_argument(
        "--walks", type=csv(positive_int), default=[1, 2, 5, 10, 20, 50, 100, 200, 1000],
        help="walks per node to estimate the mask with",
    )
    walks.add_argument(
        "--modulation-only", dest="walks", action="store_const", const=None,
        help="only the modulation figure and table (no estimator check)",
    )
    parser.add_argument("--seeds", type=positive_int, default=3, help="walk seeds per walk count")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default FIRST_RUN/grf)")
    parser.add_argument("--figure", type=Path, default=None,
                        help="the modulation figure's PNG (default OUT/grf_modulation.png)")
    add_checkpoint(parser)
    parser.set_defaults(handler=_analysis_grf, config_allocator=True)
