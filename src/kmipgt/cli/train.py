"""``kmipgt train``, ``eval`` and ``predict``: train a config (or continue a run, or check it in seconds),
evaluate a trained run, write its predictions."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from kmipgt.cli.parser import (
    FAST_DEV_BATCHES,
    add_checkpoint,
    add_overrides,
    add_trust_checkpoint,
    positive_int,
)
from kmipgt.cli.runs import load_config, use_run_allocator
from kmipgt.train.choices import PREDICTED_SPLITS

# Options of a run that writes files, which a fast dev run does not.
WRITING_OPTIONS = ("resume", "overwrite", "stop_after", "save_tokens", "tensorboard", "trust_checkpoint")


def _config(args: argparse.Namespace, extra: list[str] = ()):
    """The run config of ``train``: ``--config`` (default: the main job, or with ``--data`` the starting
    recipe of the data's task level), ``--data``'s overrides, then ``--set``'s, which win."""
    if args.data is None:
        return load_config(args.config or "minnesota", [*args.overrides, *extra])
    from kmipgt.train.recipes import data_overrides, starting_recipe

    recipe = args.config or starting_recipe(args.data, args.overrides)
    return load_config(recipe, [*data_overrides(args.data), *args.overrides, *extra])


def _train(args: argparse.Namespace) -> int:
    if args.fast_dev_run is not None:
        return _fast_dev_run(args)
    config = _config(args, ["tensorboard=true"] if args.tensorboard else [])
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
        raise KeyboardInterrupt(_interrupted(config, args)) from None
    print(json.dumps(metrics, indent=2))
    if metrics.get("complete"):
        name = metrics.get("official_metric", metrics["metric"])
        print(f"test {name}: {metrics['test']:.4f}  (run directory: {config.out_dir})")
    elif "epochs_done" in metrics:
        print(f"stopped after epoch {metrics['epochs_done']} of {config.optim.epochs}; continue with: "
              f"{_resume_command(config, args)}")
    return 0


def _fast_dev_run(args: argparse.Namespace) -> int:
    given = [f"--{name.replace('_', '-')}" for name in WRITING_OPTIONS if getattr(args, name)]
    if given:
        raise ValueError(f"--fast-dev-run writes nothing, so it takes no {', '.join(given)}")
    config = _config(args)
    from kmipgt.train.fast_dev_run import fast_dev_run

    fast_dev_run(config, args.fast_dev_run)
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
    use_run_allocator(args.run_dir, args.overrides)
    from kmipgt.train import evaluate_run

    if args.tokens_out is not None and not args.tokens_out.parent.is_dir():
        raise FileNotFoundError(f"--tokens-out: no folder {args.tokens_out.parent}")
    save_tokens = args.save_tokens or args.tokens_out is not None
    metrics = evaluate_run(
        args.run_dir, args.checkpoint, args.overrides, save_tokens=save_tokens,
        trust_checkpoint=args.trust_checkpoint, tokens_path=args.tokens_out,
    )
    print(json.dumps(metrics, indent=2))
    return 0


def _predict(args: argparse.Namespace) -> int:
    use_run_allocator(args.run_dir, args.overrides)
    from kmipgt.train import write_predictions

    rows = write_predictions(
        args.run_dir, args.out, args.graph, split=args.split, checkpoint=args.checkpoint,
        overrides=args.overrides, probabilities=args.probabilities, device=args.device,
        trust_checkpoint=args.trust_checkpoint, progress=not args.no_progress,
    )
    print(f"wrote {rows} rows to {args.out}")
    return 0


def register(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a graph transformer from a YAML config")
    train.add_argument(
        "--config",
        default=None,
        help="YAML config: a path, or a shipped config's name (kmipgt configs) (default: minnesota, the main "
        "job, what make demo runs; with --data, the starting recipe of the data's task level)",
    )
    train.add_argument(
        "--data",
        default=None,
        metavar="PATH",
        help="train on a graph of your own: a torch.save'd Data (or list, or train/val/test dict), or a "
        "folder of edges.csv and nodes.csv (or .parquet); short for --set data.name=file with its path",
    )
    add_overrides(train, "model.attention.k=32")
    again = train.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help="continue from out_dir/last.pt")
    again.add_argument(
        "--overwrite", action="store_true", help="replace the run already in out_dir (its files are deleted)"
    )
    train.add_argument(
        "--stop-after",
        type=positive_int,
        default=None,
        metavar="EPOCH",
        help="stop after this epoch (continue later with --resume)",
    )
    add_trust_checkpoint(train, "the last.pt of --resume")
    train.add_argument(
        "--save-tokens",
        action="store_true",
        help="after training, save the first attention layer's query/key tokens to tokens.pt",
    )
    train.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    train.add_argument(
        "--fast-dev-run",
        type=positive_int,
        nargs="?",
        const=FAST_DEV_BATCHES,
        default=None,
        metavar="N",
        help=f"check the config in seconds: N (default {FAST_DEV_BATCHES}) batches of training and of each "
        "evaluation split, one epoch, printing shapes, loss and time per batch; writes nothing",
    )
    train.add_argument(
        "--tensorboard",
        action="store_true",
        help="also write scalars to out_dir/tensorboard (extra: tensorboard)",
    )
    train.set_defaults(handler=_train, config_allocator=True)
    evaluate = commands.add_parser("eval", help="evaluate a trained run on every split")
    evaluate.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    add_overrides(evaluate, "data.options.num_nodes=262144 (applied to the run's saved config)")
    evaluate.add_argument(
        "--save-tokens",
        action="store_true",
        help="also save the first attention layer's query/key tokens to RUN_DIR/tokens.pt",
    )
    evaluate.add_argument(
        "--tokens-out",
        type=Path,
        default=None,
        metavar="PATH",
        help="save the tokens to PATH instead (its folder must exist; implies --save-tokens)",
    )
    add_checkpoint(evaluate)
    evaluate.set_defaults(handler=_eval, config_allocator=True)
    predict = commands.add_parser(
        "predict", help="write a trained run's predictions: a row per node, graph or pair (CSV, Parquet, .pt)"
    )
    predict.add_argument("run_dir", type=Path, help="run directory written by kmipgt train")
    predict.add_argument(
        "--out", type=Path, required=True, metavar="FILE",
        help="where the rows go; the extension picks the format: .csv, .parquet (extra: parquet) or .pt",
    )
    predict.add_argument(
        "--split", choices=PREDICTED_SPLITS, default="all",
        help="the nodes, graphs or pairs of one split, or all of them",
    )
    predict.add_argument(
        "--graph", type=Path, default=None, metavar="FILE.pt",
        help="predict on this graph (a PyG Data saved with torch.save, read weights-only) instead",
    )
    add_overrides(predict, "data.options.seed=1 (new data given as a config gives it)")
    predict.add_argument(
        "--probabilities", action="store_true",
        help="also the class probabilities (or each binary target's), a column per class",
    )
    predict.add_argument(
        "--device", default=None, help="where the model runs, e.g. cuda (default: the run's device)"
    )
    predict.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_checkpoint(predict)
    predict.set_defaults(handler=_predict, config_allocator=True)
