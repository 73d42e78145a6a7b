"""The search-backend registry: its entries and flags, the layering of kmipgt.ops.search, and `auto`."""

import ast
import importlib.util
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

import kmipgt.ops.search.backends.fused_search as fused_backend
import kmipgt.ops.search.backends.triton_search as triton_backend
import kmipgt.ops.search.registry as registry
from kmipgt.ops import APPROXIMATE_BACKENDS, SEARCH_BACKENDS, topk_inner_product
from kmipgt.ops.search.cuda_device import SM90_SHARED_MEMORY
from kmipgt.ops.search.dispatch import Backend
from kmipgt.ops.search.fused_kernel import fused_library

SEARCH_DIR = Path(registry.__file__).parent
HALF_AND_FLOAT = (torch.float32, torch.float16, torch.bfloat16)
DTYPES = (*HALF_AND_FLOAT, torch.float64)


def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def _auto(device_type: str, dtype: torch.dtype) -> str:
    """The backend `auto` routes a small search (k = 6, d = 5, graphs of up to 180 nodes) to."""
    return registry.route(registry.SearchCall(device_type, dtype, 6, 5, 180, False, SM90_SHARED_MEMORY)).name


# name -> (exact, devices, dtypes, auto_rank); None: any device / any dtype / never picked by `auto`.
EXPECTED_FLAGS = {
    "torch": (True, None, None, 2),
    "dense": (True, None, None, None),
    "keops": (True, ("cpu", "cuda"), None, None),
    "fused": (True, ("cpu",), HALF_AND_FLOAT, 0),
    "triton": (True, ("cuda",), HALF_AND_FLOAT, 1),
    "ivf": (False, None, None, None),
    "faiss": (False, None, None, None),
}


def test_registry_lists_every_backend_with_its_flags():
    backends = registry.registered_backends()
    assert list(backends) == list(EXPECTED_FLAGS)
    for name, (exact, devices, dtypes, auto_rank) in EXPECTED_FLAGS.items():
        backend = backends[name]
        assert (backend.name, backend.exact, backend.devices, backend.auto_rank) == (
            name,
            exact,
            devices,
            auto_rank,
        )
        assert backend.dtypes == dtypes, name
        # The exact CPU and any-device searches take keys in graphs of their own (test_queries_keys.py).
        assert backend.queries_differ is (name in {"torch", "dense", "fused", "ivf"}), name


def test_availability_follows_the_optional_packages_and_the_compiler():
    available = {name: b.available() for name, b in registry.registered_backends().items()}
    assert available == {
        "torch": True,
        "dense": True,
        "keops": _installed("pykeops"),
        "fused": fused_library() is not None,
        "triton": _installed("triton"),
        "ivf": True,
        "faiss": _installed("faiss"),
    }


def test_public_backend_lists_are_derived_from_the_registry():
    backends = registry.registered_backends()
    assert ("auto", *backends) == SEARCH_BACKENDS
    assert tuple(name for name, b in backends.items() if not b.exact) == APPROXIMATE_BACKENDS
    assert APPROXIMATE_BACKENDS == ("ivf", "faiss")
    # The Literal for type checkers must not drift from the registry.
    assert typing.get_args(Backend) == SEARCH_BACKENDS


def _imported_modules(path: Path) -> set[str]:
    """Every module an `import` anywhere in ``path`` names (``from a import b`` names ``a`` and ``a.b``)."""
    package = "kmipgt." + ".".join(path.relative_to(SEARCH_DIR.parents[1]).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _module_name(path: Path) -> str:
    parts = path.relative_to(SEARCH_DIR.parents[1]).with_suffix("").parts
    return ".".join(("kmipgt", *parts)).removesuffix(".__init__")


def test_no_backend_imports_another_backend_or_the_dispatcher():
    backends_dir = SEARCH_DIR / "backends"
    backend_modules = {_module_name(p) for p in backends_dir.glob("*.py") if p.name != "__init__.py"}
    assert len(backend_modules) == 6
    # `kmipgt.ops` and the backends package import the dispatcher and every backend.
    forbidden = {"kmipgt.ops", "kmipgt.ops.search.dispatch", "kmipgt.ops.search.backends"}
    checked = 0
    for path in sorted(SEARCH_DIR.rglob("*.py")):
        module = _module_name(path)
        if module in ("kmipgt.ops.search.dispatch", "kmipgt.ops.search.backends"):
            continue  # the two places that gather the backends
        bad = _imported_modules(path) & ((backend_modules - {module}) | forbidden)
        assert not bad, f"{module} imports {sorted(bad)}"
        checked += 1
    assert checked >= len(backend_modules) + 6  # backends and the shared modules were all read


def test_unknown_backend_error_names_the_registered_backends():
    with pytest.raises(ValueError, match="`backend` must be one of") as error:
        topk_inner_product(torch.randn(4, 1, 2), torch.randn(4, 1, 2), 2, backend="annoy")
    for name in SEARCH_BACKENDS:
        assert repr(name) in str(error.value)


@pytest.mark.parametrize("name", ["auto", "torch"])
def test_names_are_registered_once(name):
    entry = registry.SearchBackend(name=name, search=lambda *a: None, exact=True, available=lambda: True)
    with pytest.raises(ValueError, match=repr(name) if name != "auto" else "'auto'"):
        registry.register(entry)


@pytest.mark.parametrize("dtype", DTYPES)
def test_auto_on_cpu_is_fused_where_it_builds_and_takes_the_dtype_else_torch(dtype):
    # docs/search.md: "`fused` on CPU (float32/16/bf16), ..., else `torch`".
    expected = "fused" if dtype in HALF_AND_FLOAT and fused_library() is not None else "torch"
    assert _auto("cpu", dtype) == expected
    gen = torch.Generator().manual_seed(0)
    query, key = (torch.randn(300, 2, 5, generator=gen).to(dtype) for _ in range(2))
    ptr = torch.tensor([0, 120, 120, 300])
    auto = topk_inner_product(query, key, 6, ptr=ptr)
    chosen = topk_inner_product(query, key, 6, ptr=ptr, backend=expected)
    np.testing.assert_array_equal(auto[1].numpy(), chosen[1].numpy())
    assert torch.equal(auto[0], chosen[0])


def test_auto_on_cpu_without_the_kernel_is_torch(monkeypatch):
    monkeypatch.setattr(fused_backend, "fused_library", lambda: None)
    assert _auto("cpu", torch.float32) == "torch"


@pytest.mark.parametrize(
    ("installed", "dtype", "expected"),
    [
        (True, torch.float32, "triton"),
        (True, torch.float64, "torch"),
        (False, torch.float32, "torch"),
    ],
)
def test_auto_on_cuda_is_triton_where_installed_else_torch(installed, dtype, expected, monkeypatch):
    monkeypatch.setattr(triton_backend, "triton_available", lambda: installed)
    assert _auto("cuda", dtype) == expected


def test_auto_on_other_devices_is_torch():
    assert _auto("mps", torch.float32) == "torch"


def test_a_registered_backend_is_dispatched_with_the_options_its_kind_takes(monkeypatch):
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    calls = []

    def search(query, key, k, ptr, **options):
        calls.append(options)
        return topk_inner_product(query, key, k, ptr=ptr, backend="torch")

    registry.register(registry.SearchBackend("probe", search, exact=False, available=lambda: True))
    query = torch.randn(6, 1, 3)
    topk_inner_product(query, query, 2, backend="probe", nprobe=3)
    assert calls == [{"nlist": None, "nprobe": 3, "recall": None, "calibration": None}]
