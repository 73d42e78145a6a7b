"""Options generated from a config dataclass: one flag per field, typed, with its default, help and choices;
the benchmarks' flags are their configs' fields, added only when the benchmark is chosen."""

import argparse
import subprocess
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import pytest

import kmipgt.cli
from kmipgt.bench.attention import AttentionBenchConfig
from kmipgt.bench.grf import GRFBenchConfig
from kmipgt.bench.ragged import RaggedBenchConfig
from kmipgt.bench.search import SearchBenchConfig
from kmipgt.bench.train import TrainBenchConfig
from kmipgt.cli import build_parser
from kmipgt.cli.parser import Parser, add_fields

SRC = Path(kmipgt.cli.__file__).parents[2]


@dataclass
class Toy:
    count: int = field(default=3, metadata={"help": "how many"})
    k: int = field(default=2, metadata={"help": "one letter"})
    rate: float | None = field(default=None, metadata={"help": "a rate"})
    names: list[str] = field(default_factory=lambda: ["a"], metadata={"help": "some names"})
    sizes: tuple[int, ...] | None = field(default=None, metadata={"help": "some sizes"})
    kind: str = field(default="x", metadata={"help": "a kind", "choices": ("x", "y")})
    fast: bool = field(default=True, metadata={"help": "go fast"})


@dataclass
class Louder(Toy):
    count: int = 5  # redeclared for its default only: the help is the base's


def _parser(config_class=Toy, **kwargs) -> argparse.ArgumentParser:
    parser = Parser(prog="toy")
    add_fields(parser, config_class, **kwargs)
    return parser


def test_each_field_is_a_typed_flag_with_its_default():
    assert vars(_parser().parse_args([])) == {f.name: getattr(Toy(), f.name) for f in fields(Toy)}
    given = _parser().parse_args(["--count", "4", "-k", "7", "--rate", "0.5", "--names", "b,c",
                                  "--sizes", "1,2", "--kind", "y", "--no-fast"])
    assert vars(given) == {"count": 4, "k": 7, "rate": 0.5, "names": ["b", "c"], "sizes": (1, 2),
                           "kind": "y", "fast": False}


@pytest.mark.parametrize("argv", [["--count", "x"], ["--kind", "z"], ["--names", ",,"], ["--sizes", "1,a"]])
def test_a_bad_value_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args(argv)
    assert stop.value.code == 2
    assert capsys.readouterr().err.startswith("kmipgt: error: argument --")


def test_help_is_the_fields_help_with_its_default():
    text = _parser().format_help()
    assert "how many (default: 3)" in text and "go fast (default: True)" in text
    assert "-k K, --k K" in text and "a rate\n" in text  # a None default is not shown


def test_a_redeclared_field_keeps_the_base_help_and_takes_its_own_default():
    parser = _parser(Louder)
    assert parser.parse_args([]).count == 5 and "how many (default: 5)" in parser.format_help()


def test_excluded_fields_get_no_option():
    args = _parser(exclude=("names", "sizes")).parse_args([])
    assert args.count == 3 and not hasattr(args, "names") and not hasattr(args, "sizes")


def test_a_field_without_help_or_default_is_refused():
    @dataclass
    class Bare:
        count: int = 1

    @dataclass
    class Required:
        count: int = field(metadata={"help": "how many"})

    with pytest.raises(TypeError, match="'count' of Bare has no help"):
        _parser(Bare)
    with pytest.raises(TypeError, match="'count' of Required needs a default"):
        _parser(Required)


@pytest.mark.parametrize(("command", "config_class", "computed"), [
    ("attention", AttentionBenchConfig, {"n_values"}),
    ("search", SearchBenchConfig, {"n_values"}),
    ("grf", GRFBenchConfig, set()),
    ("ragged", RaggedBenchConfig, set()),
    ("train", TrainBenchConfig, {"n_values", "edges_per_node", "overrides"}),
])
def test_a_benchmarks_flags_are_its_configs_fields(command, config_class, computed):
    args = vars(build_parser().parse_args(["bench", command]))
    for f in fields(config_class):
        if f.name not in computed:
            assert args[f.name] == (f.default_factory() if callable(f.default_factory) else f.default), f.name


def test_bench_train_defaults_to_londons_size():
    from kmipgt.data.city_networks import CITY_NUM_EDGES, CITY_NUM_NODES

    args = build_parser().parse_args(["bench", "train"])
    assert args.n_max == CITY_NUM_NODES["london"]
    assert args.edges_per_node == CITY_NUM_EDGES["london"] / CITY_NUM_NODES["london"]


def test_help_of_every_command_imports_no_benchmark():
    code = ("import sys; from kmipgt.cli import build_parser; build_parser().format_help(); "
            "assert not [m for m in sys.modules if m.startswith(('torch', 'kmipgt.bench'))]")
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(SRC)}, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
