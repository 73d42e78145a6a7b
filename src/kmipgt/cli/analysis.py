"""``kmipgt analysis``: inspect trained models (attended keys, GRF modulation), label signal by hops, curves,
S-SEG-WL."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kmipgt.atomic import atomic_write_json, atomic_write_text
from kmipgt.cli.analysis_grf import add_grf
from kmipgt.cli.parser import add_checkpoint, add_overrides, csv, positive_int
from kmipgt.cli.runs import load_config, use_run_allocator


def _layer_or_all(text: str) -> int | None:
    return None if text == "all" else int(text)


def _graph_or_all(text: str) -> int | str:
    return text if text == "all" else int(text)


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


def _explain_inputs(args: argparse.Namespace):
    """Load the run and check every option against it (ValueError/FileNotFoundError naming the value)."""
    from kmipgt.analysis import check_queries, sample_queries, select_layers_heads
    from kmipgt.data import virtual_node_mask
    from kmipgt.train import load_run, split_graph

    if args.graph == "all" and args.nodes is not None:
        raise ValueError("--nodes names queries of one graph; --graph all writes statistics only")
    use_run_allocator(args.run_dir)
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

    trainer, part, queries = _explain_inputs(args)
    options = {
        "k": trainer.config.model.attention.k, "layer": args.layer, "head": args.head, "seed": args.seed,
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
    atomic_write_json(out / "explain.json", result)
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
    from kmipgt.train import load_config as read_config
    from kmipgt.train.metrics import higher_is_better
    from kmipgt.train.report import best_evaluation, plot_comparison, read_history

    names = [run.name for run in args.runs]
    # Runs that share a label share a colour, as seeds of one model: a name clash must not pose as one.
    labels = args.labels or (names if len(set(names)) == len(names) else [str(run) for run in args.runs])
    if len(labels) != len(args.runs):
        raise ValueError(f"--labels names {len(labels)} runs, {len(args.runs)} are given")
    histories = [read_history(run) for run in args.runs]
    metrics = {read_config(run / "config.yaml").task.metric for run in args.runs}
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
    config = load_config(args.config, args.overrides)
    from kmipgt.analysis import label_agreement_by_hops, neighbourhood_probe
    from kmipgt.train.datasets import prepare_data
    from kmipgt.train.graph_features import node_coords

    if config.task.level not in (None, "node"):
        raise ValueError(f"the probe needs a node-level task, got task.level={config.task.level!r}")
    graph = prepare_data(config).graph
    rows = neighbourhood_probe(
        graph.x,
        graph.y,
        graph.edge_index,
        graph.train_mask,
        graph.test_mask,
        node_coords(graph, config.model.encoder.coord_columns),
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
        atomic_write_text(args.out, json.dumps(record, indent=2))
    return 0


def _analysis_wl(args: argparse.Namespace) -> int:
    from kmipgt.analysis.seg_wl import seg_wl
    from kmipgt.data import load_graph

    graphs = [load_graph(path) for path in (args.first, args.second)]
    result = seg_wl(graphs, args.encoding, rwse_steps=args.rwse_steps, features=not args.no_features)
    sizes = " and ".join(f"{g.num_nodes} nodes" for g in graphs)
    rounds = f"stable after {result.rounds} round{'s' * (result.rounds != 1)}, {result.num_colours} colours"
    print(f"S-SEG-WL ({args.encoding}) on {sizes}: {rounds}")
    print("distinguished" if result.distinguished else "not distinguished")
    return 0


def _add_explain(analysis: argparse._SubParsersAction) -> None:
    parser = analysis.add_parser(
        "explain", help="which keys k-MIP (or full) attention attends to, with hop and label statistics"
    )
    parser.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    chosen = parser.add_mutually_exclusive_group()
    chosen.add_argument("--nodes", type=csv(int), default=None, help="comma-separated query node ids")
    chosen.add_argument("--sample", type=int, default=8, help="random queries of the split")
    parser.add_argument("--split", default="test", help="train, val or test (statistics run over it)")
    parser.add_argument("--graph", type=_graph_or_all, default=0,
                        help="graph of the split (graph/edge-level runs); all: statistics over every graph "
                             "of a graph-level split")
    parser.add_argument("--layer", type=_layer_or_all, default=None, help="all (default) or a layer index")
    parser.add_argument("--head", type=_layer_or_all, default=None, help="all (default) or a head index")
    parser.add_argument("--seed", type=int, default=0, help="seed of --sample and of the uniform reference")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default RUN_DIR/explain)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_checkpoint(parser)
    parser.set_defaults(handler=_analysis_explain, config_allocator=True)


def _add_probe(analysis: argparse._SubParsersAction) -> None:
    probe = analysis.add_parser(
        "probe", help="linear probe: label signal in hop neighbourhoods vs spatial neighbourhoods"
    )
    probe.add_argument("--config", type=Path, required=True, help="run config naming the dataset")
    add_overrides(probe, "data.options.num_nodes=20000")
    probe.add_argument("--hops", type=csv(int), default=[0, 2, 4, 8, 16], help="hop counts")
    probe.add_argument(
        "--spatial", type=csv(int), default=[16, 64, 256, 1024], help="spatial neighbourhood sizes"
    )
    probe.add_argument(
        "--label-k", type=csv(int), default=[1, 5, 15],
        help="training nodes voting in the nearest-labels rows (their labels, no features)",
    )
    probe.add_argument(
        "--rings", type=csv(_hop_range), default=[(1, 1), (2, 4), (5, 8), (9, 16), (17, 32)],
        help="hop ranges of the same-label rows: how often nodes that far apart share a label",
    )
    probe.add_argument(
        "--pairs-from", type=positive_int, default=2000,
        help="source nodes the same-label rows count pairs from",
    )
    probe.add_argument("--out", type=Path, default=None, help="also write the rows as JSON here")
    probe.set_defaults(handler=_analysis_probe, config_allocator=True)


def register(commands: argparse._SubParsersAction) -> None:
    analysis = commands.add_parser("analysis", help="inspect trained models").add_subparsers(
        dest="analysis_command", required=True
    )
    _add_explain(analysis)
    _add_probe(analysis)
    add_grf(analysis)
    curves = analysis.add_parser(
        "curves", help="several runs' training loss and validation metric on one plot, best epochs as a table"
    )
    curves.add_argument("runs", type=Path, nargs="+", help="run directories written by kmipgt train")
    curves.add_argument(
        "--labels", type=csv(str), default=None,
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
