"""Command-line interface: ``kmipgt train`` and ``kmipgt eval`` (thin: parse, call, print)."""

from __future__ import annotations

import argparse
import json
import sys


def _add_train(subparsers) -> None:
    parser = subparsers.add_parser("train", help="train a graph transformer from a YAML config")
    parser.add_argument("--config", help="YAML config (default: built-in defaults)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key, e.g. --set model.k=32 (repeatable)",
    )
    parser.add_argument("--resume", action="store_true", help="continue from out_dir/last.pt")
    parser.add_argument(
        "--stop-after", type=int, metavar="EPOCH", help="stop after this epoch (resume later with --resume)"
    )
    parser.add_argument(
        "--save-tokens",
        action="store_true",
        help="after training, save the first attention layer's query/key tokens to tokens.pt",
    )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    parser.set_defaults(func=_run_train)


def _add_eval(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a trained run on every split")
    parser.add_argument("run_dir", help="run directory written by kmipgt train")
    parser.add_argument("--checkpoint", choices=("best", "last"), default="best")
    parser.set_defaults(func=_run_eval)


def _run_train(args) -> None:
    from kmipgt.train import load_config, train

    config = load_config(args.config, args.overrides)
    metrics = train(
        config,
        resume=args.resume,
        stop_after=args.stop_after,
        save_tokens=args.save_tokens,
        progress=not args.no_progress,
    )
    print(json.dumps(metrics, indent=2))
    if metrics.get("complete"):
        print(f"test {metrics['metric']}: {metrics['test']:.4f}  (run directory: {config.out_dir})")


def _run_eval(args) -> None:
    from kmipgt.train import evaluate_run

    print(json.dumps(evaluate_run(args.run_dir, args.checkpoint), indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kmipgt", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_train(subparsers)
    _add_eval(subparsers)
    args = parser.parse_args(argv)
    args.func(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
