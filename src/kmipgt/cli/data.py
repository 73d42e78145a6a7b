"""``kmipgt data``: the registered datasets, one loaded and summarised (a graph or a set of graphs), a
synthetic city generated."""

from __future__ import annotations

import argparse
from pathlib import Path


def _loader_option(text: str) -> tuple[str, object]:
    """argparse type of ``KEY=VALUE``, the value read as YAML like a config's ``data.options``."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def _data_list(args: argparse.Namespace) -> int:
    from kmipgt.data import get_dataset, list_datasets

    for dataset in map(get_dataset, list_datasets()):
        extra = f" (extra: {dataset.extra})" if dataset.extra else ""
        print(f"{dataset.name:<15} {'/'.join(dataset.levels):<15} {dataset.description}{extra}")
    return 0


def _data_info(args: argparse.Namespace) -> int:
    from kmipgt.data import get_dataset, list_datasets
    from kmipgt.data.report import dataset_summary

    flags = {"root": args.root, "num_nodes": args.num_nodes, "seed": args.seed}
    options = {**{key: value for key, value in flags.items() if value is not None}, **dict(args.options)}
    name = args.name
    if name not in list_datasets() and Path(name).exists():  # a graph of one's own, as --data takes it
        name, options = "file", {"path": name, **options}
    for key, value in dataset_summary(get_dataset(name), **options).items():
        print(f"{key}: {value}")
    return 0


def _data_synthetic(args: argparse.Namespace) -> int:
    from kmipgt.atomic import save_tensors
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
        save_tensors(data, args.out)
        print(f"wrote {args.out}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    data = commands.add_parser("data", help="offline datasets").add_subparsers(
        dest="data_command", required=True
    )
    data.add_parser("list", help="the registered datasets (a config's data.name)").set_defaults(
        handler=_data_list
    )
    info = data.add_parser(
        "info", help="load a dataset (one graph or a set of graphs) and print its statistics and read time"
    )
    info.add_argument(
        "name", help="a registered dataset (kmipgt data list), e.g. minnesota, or the path of a graph of "
        "your own (as kmipgt train --data takes it)",
    )
    info.add_argument("--root", type=Path, default=None, help="directory of a local copy (root option)")
    info.add_argument("--num-nodes", type=int, default=None, help="size of a synthetic city")
    info.add_argument("--seed", type=int, default=None, help="seed of a synthetic city")
    info.add_argument(
        "--set", dest="options", metavar="KEY=VALUE", type=_loader_option, action="append", default=[],
        help="another loader option, as in a config's data.options, e.g. --set name=paris (repeatable)",
    )
    info.set_defaults(handler=_data_info)
    synthetic = data.add_parser("synthetic", help="generate (and label) a synthetic city, timing each stage")
    synthetic.add_argument("--num-nodes", type=int, required=True, help="nodes of the city")
    synthetic.add_argument("--seed", type=int, default=0, help="seed of the city and its labels")
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
