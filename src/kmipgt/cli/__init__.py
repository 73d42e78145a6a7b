"""The ``kmipgt`` command line: parse, call the library, print.

One module per group of commands (:mod:`~kmipgt.cli.train`, ``export``, ``sweep``, ``configs``, ``data``,
``analysis``, ``bench``), each with ``register(commands)``. A command raises its errors and :func:`main`
prints them, one way for all (a bad command line is argparse's, in the same form). Heavy imports (torch,
PyG) happen inside the handlers, after the config is read and checked, so a bad key or option is reported
at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback

from kmipgt.cli import analysis, bench, configs, data, export, sweep, train
from kmipgt.cli.parser import USAGE_ERROR, Parser, TopHelpFormatter
from kmipgt.logs import configure_logging
from kmipgt.malloc import retain_freed_memory

__all__ = ["build_parser", "main"]

INPUT_ERRORS = (ValueError, TypeError, FileNotFoundError, ImportError)
# 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C.
INTERRUPTED = 130

DESCRIPTION = """\
kmipgt trains graph transformers with k-MIP attention (each query attends to the k keys of its graph with
the largest inner product, found exactly) on PyTorch Geometric data, and measures them.

  kmipgt train                          the main job: GPS + k-MIP on the embedded Minnesota road network
  kmipgt train --config NAME            another shipped config (kmipgt configs lists them) or a YAML file
  kmipgt eval RUN_DIR                   re-evaluate a trained run
  kmipgt export RUN_DIR                 the trained model as a torch.export program (.pt2)
  kmipgt predict RUN_DIR --out FILE     a trained run's predictions, on its data or new data
  kmipgt sweep NAME                     train every cell of a grid of configs and summarise
  kmipgt configs                        the shipped run configs and sweeps, each with what it is
  kmipgt data list                      the datasets, all usable offline
  kmipgt analysis explain RUN_DIR       which keys a trained model attends to (and other inspections)
  kmipgt bench attention                time and memory of k-MIP against full attention (and other benchmarks)

Each command has its own --help.
"""


def build_parser() -> argparse.ArgumentParser:
    from kmipgt import __version__

    parser = Parser(prog="kmipgt", description=DESCRIPTION, formatter_class=TopHelpFormatter)
    parser.add_argument("--version", action="version", version=f"kmipgt {__version__}")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    verbosity = parser.add_mutually_exclusive_group()
    verbosity.add_argument(
        "-q", "--quiet", action="store_true", help="only warnings and errors (no progress bars)"
    )
    verbosity.add_argument("-v", "--verbose", action="store_true", help="also debug lines (one per epoch)")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (train, export, sweep, configs, data, analysis, bench):
        group.register(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command. An error prints ``kmipgt: error: <message>`` and returns 2 for bad input (its whole
    message) or 1 (its first line; ``--debug`` adds the traceback); Ctrl-C prints one line (the
    ``KeyboardInterrupt``'s message, if a command gave it one) and returns 130."""
    args = build_parser().parse_args(argv)
    configure_logging(logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO)
    # Commands that read a config apply its `allocator` once it is loaded: glibc's own policy cannot be
    # restored after mallopt, so nothing may be set before. The others keep freed memory.
    if not getattr(args, "config_allocator", False):
        retain_freed_memory()
    try:
        return args.handler(args)
    except KeyboardInterrupt as stop:
        print(f"kmipgt: {stop.args[0] if stop.args else 'interrupted'}", file=sys.stderr)
        return INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``kmipgt configs | head``): not an error; silence the flush at exit.
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        return 0
    except Exception as error:
        if args.debug:
            traceback.print_exc()
        message = str(error).strip() or type(error).__name__
        if not isinstance(error, INPUT_ERRORS):
            message = message.splitlines()[0]
        print(f"kmipgt: error: {message}", file=sys.stderr)
        return USAGE_ERROR if isinstance(error, INPUT_ERRORS) else 1
