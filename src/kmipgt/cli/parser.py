"""The ``kmipgt`` parser's parts: its one-line errors, defaults in help, comma lists, and options generated
from a config dataclass's fields.

A command's options may be deferred to when it is chosen (``add_parser(..., options=fill)``): a benchmark's
config dataclass lives in a module that imports torch, which ``--help`` and every other command do without.
"""

from __future__ import annotations

import argparse
import types
import typing
from collections.abc import Callable, Iterable
from dataclasses import MISSING, fields

# Exit status of a bad command line, option, config or input file; anything else that fails exits 1.
USAGE_ERROR = 2
# Batches of each phase that --fast-dev-run checks when given no number.
FAST_DEV_BATCHES = 2


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, unless its help already says it or there is none to show."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        # `is`: 0 == False, and a default of 0 is shown.
        nothing = action.default is None or action.default is False or action.default == []
        if nothing or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


class TopHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """Keeps the line breaks of the description (its command table)."""


class _Commands(argparse._SubParsersAction):
    """Subcommands whose options a function ``options(parser)`` may add once the command is chosen."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: dict[str, Callable[[argparse.ArgumentParser], None]] = {}

    def add_parser(self, name: str, *, options=None, **kwargs) -> argparse.ArgumentParser:
        parser = super().add_parser(name, **kwargs)
        if options is not None:
            self._deferred[name] = options
        return parser

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        options = self._deferred.pop(values[0], None)
        if options is not None:
            options(self._name_parser_map[values[0]])
        super().__call__(parser, namespace, values, option_string)


class Parser(argparse.ArgumentParser):
    """argparse with the one-line ``kmipgt: error: ...`` of every other CLI error (exit 2), defaults in
    every command's help, and subcommands that may defer their options."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Commands)

    def error(self, message: str):
        self.exit(USAGE_ERROR, f"kmipgt: error: {message} (see {self.prog} --help)\n")


def csv(kind: type, container: type = list) -> Callable[[str], list | tuple]:
    """argparse type of a non-empty comma-separated list of ``kind`` values (``--n ,,,`` is an error)."""

    def parse(text: str) -> list | tuple:
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"expected comma-separated {kind.__name__} values, got {text!r}")
        try:
            return container(kind(item) for item in items)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__} values, got {text!r}") from error

    return parse


def positive_int(text: str) -> int:
    """argparse type of an integer >= 1."""
    try:
        value = int(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from error
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


def _value_type(annotation) -> Callable[[str], object]:
    """The argparse type of a field annotated ``annotation``: ``X | None`` as X, lists and tuples as
    comma lists."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        (annotation,) = [arm for arm in typing.get_args(annotation) if arm is not type(None)]
    container = typing.get_origin(annotation)
    if container in (list, tuple):
        return csv(typing.get_args(annotation)[0], container)
    return annotation


def _field_metadata(config_class: type, name: str) -> typing.Mapping:
    """The metadata of field ``name`` of the first class in ``config_class``'s MRO that documents it (a
    subclass may redeclare a field only to change its default)."""
    for cls in config_class.__mro__:
        field = getattr(cls, "__dataclass_fields__", {}).get(name)
        if field is not None and "help" in field.metadata:
            return field.metadata
    raise TypeError(f"field {name!r} of {config_class.__name__} has no help (metadata={{'help': ...}})")


def add_fields(
    parser: argparse.ArgumentParser,
    config_class: type,
    exclude: Iterable[str] = (),
) -> None:
    """One option per field of the dataclass ``config_class``, not in ``exclude``: ``--field-name`` (and
    ``-x`` for a one-letter field), typed by its annotation, its default the field's, its help and choices
    the field's metadata ``help`` and ``choices``. A bool field is ``--x/--no-x``."""
    hints = typing.get_type_hints(config_class)
    for field in fields(config_class):
        if field.name in exclude:
            continue
        if field.default is not MISSING:
            default = field.default
        elif field.default_factory is not MISSING:
            default = field.default_factory()
        else:
            raise TypeError(f"field {field.name!r} of {config_class.__name__} needs a default or exclusion")
        metadata = _field_metadata(config_class, field.name)
        flags = [f"--{field.name.replace('_', '-')}"]
        if len(field.name) == 1:
            flags.insert(0, f"-{field.name}")
        options = {"default": default, "help": metadata["help"]}
        if hints[field.name] is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            options.update(type=_value_type(hints[field.name]), choices=metadata.get("choices"))
        parser.add_argument(*flags, **options)


def config_from_args(config_class: type, args: argparse.Namespace, **values):
    """A dataclass config whose fields not given in ``values`` are the same-named CLI options."""
    options = {f.name: getattr(args, f.name) for f in fields(config_class) if hasattr(args, f.name)}
    return config_class(**{**options, **values})


def add_overrides(parser: argparse.ArgumentParser, example: str) -> None:
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a config key, e.g. --set {example} (repeatable)",
    )


def add_checkpoint(parser: argparse.ArgumentParser, which: str = "the checkpoint") -> None:
    """``--checkpoint best|last`` and ``--trust-checkpoint``, for a command that loads a trained run."""
    parser.add_argument(
        "--checkpoint", choices=("best", "last"), default="best",
        help="the run's best.pt (best validation metric) or last.pt",
    )
    add_trust_checkpoint(parser, which)


def add_trust_checkpoint(parser: argparse.ArgumentParser, which: str) -> None:
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help=f"also read NumPy arrays of numbers in {which}, as the last.pt of kmipgt 0.1.0 holds (its RNG "
        "states); checkpoints are read weights-only either way, so no code in them runs",
    )

