"""kmipgt's imports follow the layers the README draws, no module imports itself back through others, and
no module is over :data:`LINE_LIMIT` lines.

Every import counts, including those inside functions (a lazy import hides a cycle; it does not remove it).
"""

import ast
import re
from pathlib import Path

import kmipgt

PACKAGE = Path(kmipgt.__file__).parent
README = Path(__file__).resolve().parents[1] / "README.md"
# A module longer than this does more than one job: split it by what each part is for.
LINE_LIMIT = 400


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> set[str]:
    return {_module_name(path) for path in PACKAGE.rglob("*.py")}


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The kmipgt modules ``path`` imports (``from kmipgt import ops`` counts as ``kmipgt.ops``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
    return {name for name in found if name in modules}


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    return {_module_name(path): _imports(path, modules) for path in PACKAGE.rglob("*.py")}


def _layer(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "kmipgt"


def readme_layers() -> dict[str, set[str]]:
    """The README's layer table: ``| `train` | `nn`, `data` |`` -> {"train": {"nn", "data"}}."""
    section = README.read_text().split("## Layout", 1)[1].split("\n## ", 1)[0]
    allowed = {}
    for row in re.findall(r"^\| (`[^|]+`) \| ([^|]*) \|$", section, flags=re.MULTILINE):
        names, targets = (re.findall(r"`([a-z_]+)`", cell) for cell in row)
        for name in names:
            allowed[name] = set(targets)
    return allowed


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a module path ``[a, b, ..., a]``, or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt, [*path, nxt])):
                return cycle
        state[node] = "done"
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def test_the_readme_table_names_every_package():
    layers = {_layer(module) for module in _modules()} - {"kmipgt", "__main__"}
    assert set(readme_layers()) == layers


def test_imports_point_only_where_the_readme_allows():
    allowed = readme_layers()
    wrong = sorted(
        f"{source} imports {target}"
        for source, targets in import_graph().items()
        for target in targets
        if _layer(source) not in ("cli", "__main__", "kmipgt")
        and _layer(target) not in (_layer(source), "kmipgt")
        and _layer(target) not in allowed[_layer(source)]
    )
    assert not wrong


def test_no_import_cycle():
    graph = import_graph()
    # A package's __init__ re-exports its modules; a module importing its own package would loop.
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_the_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_is_over_the_line_limit():
    long = sorted(
        f"{path.relative_to(PACKAGE.parent)} ({count} lines)"
        for path in PACKAGE.rglob("*.py")
        if (count := len(path.read_text().splitlines())) > LINE_LIMIT
    )
    assert not long, f"modules over {LINE_LIMIT} lines: {', '.join(long)}"
