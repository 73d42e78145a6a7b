"""``kmipgt export``: a trained run's model as a ``torch.export`` program (``.pt2``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from kmipgt.cli.parser import add_checkpoint, add_overrides
from kmipgt.cli.runs import use_run_allocator


def _export(args: argparse.Namespace) -> int:
    use_run_allocator(args.run_dir, args.overrides)
    from kmipgt.train.export import export_run

    if args.out is not None and not args.out.parent.is_dir():
        raise FileNotFoundError(f"--out: no folder {args.out.parent}")
    path = export_run(args.run_dir, args.out, args.checkpoint, args.overrides, args.trust_checkpoint)
    print(f"wrote {path}: load it with kmipgt imported, torch.export.load({str(path)!r}).module()")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    export = commands.add_parser(
        "export", help="export a trained run's model as a torch.export program (.pt2) of any graph size"
    )
    export.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    export.add_argument(
        "--out", type=Path, default=None, metavar="FILE",
        help="where to write it (default: RUN_DIR/model.pt2)",
    )
    add_checkpoint(export)
    add_overrides(export, "device=cpu (applied to the run's saved config)")
    export.set_defaults(handler=_export)
