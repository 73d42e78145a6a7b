"""``kmipgt configs``: the shipped run configs and sweeps, each with its first comment line."""

from __future__ import annotations

import argparse


def _show(name: str) -> int:
    """Print the config ``name`` (a shipped one's name, or a file) whole: every key, defaults filled in."""
    import yaml

    from kmipgt.train.config import config_to_dict, load_config

    print(yaml.safe_dump(config_to_dict(load_config(name)), sort_keys=False), end="")
    return 0


def _configs(args: argparse.Namespace) -> int:
    from kmipgt.configs import config_path, first_comment, list_configs

    if args.show:
        return _show(args.show)
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
    _installed_datasets()
    return 0


def _installed_datasets() -> None:
    """The datasets installed packages add (entry point group kmipgt.datasets), where there are any."""
    from kmipgt.data import DATASETS, list_datasets

    added = [name for name in list_datasets() if name not in DATASETS]
    if added:
        print(f"\ndatasets of installed packages (data.name): {', '.join(added)}")


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "configs", help="list the shipped configs (train --config NAME and sweep NAME find them by name)"
    )
    parser.add_argument("--paths", action="store_true", help="print only each config's file path")
    parser.add_argument("--show", metavar="NAME",
                        help="print a run config (a shipped one's name or a file) with every key")
    parser.set_defaults(handler=_configs)
