"""``module:attribute`` references: imported on use, anything else passed through. Lazy packages: the public
names their stub ``__init__.pyi`` lists, imported with their submodule on first use."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import kmipgt
from kmipgt.lazy import resolve, stub_sources
from test_layers import find_cycle, import_graph

PACKAGE = Path(kmipgt.__file__).parent


def test_a_reference_names_the_object_it_imports():
    assert resolve("json:dumps") is json.dumps
    assert resolve(json.dumps) is json.dumps


@pytest.mark.parametrize("text", ["json.dumps", ":dumps", "json:"])
def test_a_malformed_reference_is_a_value_error(text):
    with pytest.raises(ValueError, match=r"'package\.module:attribute' reference"):
        resolve(text)


def test_a_lazy_package_imports_a_name_with_its_module_and_lists_it():
    import kmipgt.nn

    assert "GPSLayer" in dir(kmipgt.nn)
    assert kmipgt.nn.GPSLayer is resolve("kmipgt.nn.gps_layer:GPSLayer")
    with pytest.raises(AttributeError, match=r"module 'kmipgt\.nn' has no attribute 'GPSLayr'"):
        kmipgt.nn.GPSLayr  # noqa: B018


def test_a_public_name_keeps_its_meaning_when_a_submodule_of_that_name_is_imported():
    import kmipgt.data
    from kmipgt.data import minnesota
    from kmipgt.data.minnesota import MINNESOTA_FEATURES  # binds the submodule on its package

    assert callable(minnesota) and minnesota.__module__ == "kmipgt.data.minnesota"
    assert kmipgt.data.MINNESOTA_FEATURES is MINNESOTA_FEATURES


def _stubbed_packages() -> list[str]:
    return sorted(
        ".".join(stub.parent.relative_to(PACKAGE.parent).parts) for stub in PACKAGE.rglob("__init__.pyi")
    )


def _disagreements(package: str) -> list[str]:
    """Where ``package`` and its stub disagree: ``__all__``, a name its submodule lacks or that resolves to
    another object, a name ``dir`` leaves out."""
    module = importlib.import_module(package)
    sources = stub_sources(Path(module.__file__).with_suffix(".pyi"))
    wrong = [] if module.__all__ == list(sources) else [f"__all__ {module.__all__} != stub {list(sources)}"]
    for name, submodule in sources.items():
        source = importlib.import_module(f"{package}.{submodule}")
        if not hasattr(source, name):
            wrong.append(f"{name}: {source.__name__} has no such attribute")
        elif getattr(module, name) is not getattr(source, name):
            wrong.append(f"{name}: not the object of {source.__name__}")
        if name not in dir(module):
            wrong.append(f"{name}: not in dir({package})")
    return wrong


def test_the_four_lazy_packages_have_stubs():
    assert {"kmipgt.nn", "kmipgt.data", "kmipgt.train", "kmipgt.distributed"} <= set(_stubbed_packages())


@pytest.mark.parametrize("package", _stubbed_packages())
def test_a_package_and_its_stub_agree(package):
    assert _disagreements(package) == []


def test_no_import_cycle_runs_through_a_stub():
    # test_layers reads .py files only, and a lazy package's __init__.py no longer names its submodules: at
    # first use it imports those its stub names, so a submodule importing its own package's names would loop.
    graph = import_graph()
    for package in _stubbed_packages():
        stub = PACKAGE.parent.joinpath(*package.split("."), "__init__.pyi")
        graph[package] |= {f"{package}.{submodule}" for submodule in stub_sources(stub).values()}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A lazy package ``stub_plant`` whose submodule ``things`` defines ``present``; write its stub."""
    root = tmp_path / "stub_plant"
    root.mkdir()
    (root / "__init__.py").write_text("import kmipgt.lazy\n\nkmipgt.lazy.lazy_package(__name__, __file__)\n")
    (root / "things.py").write_text("present = object()\n")
    monkeypatch.syspath_prepend(tmp_path)
    yield root / "__init__.pyi"
    for name in [name for name in sys.modules if name.partition(".")[0] == "stub_plant"]:
        del sys.modules[name]


def test_the_agreement_check_reports_a_stub_name_its_submodule_lacks(planted):
    planted.write_text("from .things import missing as missing\nfrom .things import present as present\n")
    assert _disagreements("stub_plant") == ["missing: stub_plant.things has no such attribute"]


def test_a_public_name_keeps_its_meaning_when_its_submodule_is_imported_before_it_is_used(planted):
    # The order that matters: once the name is cached on the package, a later submodule import is a no-op.
    (planted.parent / "present.py").write_text("def present():\n    pass\n")
    planted.write_text("from .present import present as present\n")
    importlib.import_module("stub_plant.present")  # as the registry does; binds the submodule on its package
    package = sys.modules["stub_plant"]
    assert callable(package.present) and package.present.__module__ == "stub_plant.present"


@pytest.mark.parametrize(("stub", "line", "error"), [
    ("from .things import present\n", 1, "expected only 'from .submodule import name as name' lines"),
    ("from .things import present as other\n", 1, "expected only"),
    ("from .things import *\n", 1, "expected only"),
    ("from kmipgt.nn.things import present as present\n", 1, "expected only"),
    ("from . import things as things\n", 1, "expected only"),
    ("present = 1\n", 1, "expected only"),
    ("from .things import present as present\n\nfrom .other import present as present\n", 3,
     "'present' is imported twice"),
])
def test_a_malformed_stub_is_a_value_error_naming_its_line(planted, stub, line, error):
    planted.write_text(stub)
    with pytest.raises(ValueError, match=rf"__init__\.pyi:{line}: {error}"):
        importlib.import_module("stub_plant")


def test_the_lazy_packages_and_their_torch_free_modules_import_no_torch():
    code = (
        "import sys, kmipgt.nn, kmipgt.train, kmipgt.data, kmipgt.distributed; "
        "import kmipgt.train.config, kmipgt.data.registry, kmipgt.nn.choices, kmipgt.distributed.choices; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(PACKAGE.parent)},
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
