"""``kmipgt sweep``: train every cell of a grid of config overrides, then write the summaries; or list the
cells, or check each in seconds."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from kmipgt.cli.parser import FAST_DEV_BATCHES, add_overrides, positive_int


def _jobs(text: str) -> int | str:
    """argparse type of ``--jobs``: an integer >= 1, or ``auto``."""
    return text if text == "auto" else positive_int(text)


def _sweep(args: argparse.Namespace) -> int:
    from kmipgt.sweep import (
        cell_dir,
        cell_overrides,
        cell_state,
        check_cells,
        expand,
        load_sweep,
        run_sweep,
        write_reports,
    )
    from kmipgt.sweep.archive import pack, unpack
    from kmipgt.sweep.jobs import auto_jobs
    from kmipgt.sweep.time_limit import TimeLimit
    from kmipgt.train import load_config

    # Counted from here: the limit is the command's, not its cells'.
    limit = None if args.time_limit is None else TimeLimit.after(args.time_limit)
    sweep = load_sweep(args.sweep, out=args.out, overrides=args.overrides)
    cells = expand(sweep)
    check_cells(sweep, cells)
    if args.fast_dev_run is not None:
        return _fast_dev_run(sweep, cells, args.fast_dev_run)
    if args.dry_run:
        print(f"{len(cells)} cells of {sweep.path} (base {sweep.base}) in {sweep.out}:")
        for cell in cells:
            print(f"  {cell.label}  [{cell_state(sweep, cell)}]  {cell_dir(sweep, cell)}")
        return 0
    if args.unpack is not None:
        unpacked = unpack(sweep, args.unpack)
        print(f"unpacked {len(unpacked)} cells from {args.unpack} (cells started here are kept)")
    jobs = args.jobs
    if jobs == "auto":
        jobs = auto_jobs(len(cells), load_config(sweep.base, cell_overrides(sweep, cells[0])).device)
    within = "" if limit is None else f", all stopped within {args.time_limit} s"
    print(f"{len(cells)} cells, {jobs} at a time, in {sweep.out}{within}")
    rows = run_sweep(sweep, jobs=jobs, limit=limit)
    options = [f"--jobs={args.jobs}", f"--out={sweep.out}", *(f"--set={text}" for text in args.overrides)]
    if args.time_limit is not None:
        options.append(f"--time-limit={args.time_limit}")
    command = shlex.join(["kmipgt", "sweep", str(args.sweep), *options])
    write_reports(sweep, rows, command)
    failed = sum(row["status"] == "failed" for row in rows)
    unfinished = sum(row["status"] == "unfinished" for row in rows)
    again = f"; {unfinished} unfinished: run the same command again to resume them" if unfinished else ""
    print(f"wrote {sweep.out / 'results.csv'}, summary.md, summary.csv, summary.png; {failed} cells failed"
          + again)
    if args.pack is not None:
        parts = pack(sweep, args.pack)
        size = sum(part.stat().st_size for part in parts) / 2**20
        print(f"packed the cells into {', '.join(map(str, parts))} ({size:.1f} MiB)")
    return 1 if failed else 0


def _fast_dev_run(sweep, cells, batches: int) -> int:
    from kmipgt.sweep import cell_overrides
    from kmipgt.train import load_config
    from kmipgt.train.fast_dev_run import fast_dev_run_configs

    print(f"fast dev run of the {len(cells)} cells of {sweep.path}, {batches} batches each; nothing written")
    configs = ((f"cell {cell.label}", load_config(sweep.base, cell_overrides(sweep, cell))) for cell in cells)
    failed = fast_dev_run_configs(configs, batches)
    print(f"{len(cells) - len(failed)} of {len(cells)} cells passed")
    for label in failed:
        print(f"  failed: {label}")
    return 1 if failed else 0


def register(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("sweep", help="train each cell of a grid of config overrides; summarise")
    parser.add_argument(
        "sweep", type=Path, help="sweep YAML (a path or a shipped name, e.g. sweeps/influence_of_k)"
    )
    parser.add_argument(
        "--jobs", type=_jobs, default=1, metavar="N",
        help="cells trained at once, each in its own process (sharing the device); auto: as many as the "
        "GPU's memory holds at 4 GiB a cell, at most one per CPU (on the CPU: 1)",
    )
    parser.add_argument(
        "--time-limit", type=positive_int, default=None, metavar="SECONDS",
        help="stop every cell at an epoch boundary before SECONDS have passed (each keeps its last.pt); the "
        "same command run again resumes the unfinished ones",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the file's out)")
    parser.add_argument(
        "--unpack", type=Path, default=None, metavar="ARCHIVE",
        help="before training, unpack the cells of an archive written by --pack (on another machine) that "
        "have not started here, so that they resume",
    )
    parser.add_argument(
        "--pack", type=Path, default=None, metavar="ARCHIVE",
        help="after training, pack every started cell into ARCHIVE (.tar.gz; parts ARCHIVE.000, ... above "
        "15 MiB): finished cells without their checkpoints, unfinished ones with what --resume reads",
    )
    add_overrides(parser, "optim.epochs=20 (added to the file's set, for every cell)")
    checks = parser.add_mutually_exclusive_group()
    checks.add_argument("--dry-run", action="store_true", help="list the cells and their state, then exit")
    checks.add_argument(
        "--fast-dev-run", type=positive_int, nargs="?", const=FAST_DEV_BATCHES, default=None, metavar="N",
        help=f"check every cell in this process: N (default {FAST_DEV_BATCHES}) batches of training and of "
        "each evaluation split, as kmipgt train --fast-dev-run; writes nothing",
    )
    parser.set_defaults(handler=_sweep)
