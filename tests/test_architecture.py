"""The import graph of ``src/gradzip`` is layered and acyclic.

Every module belongs to a layer (by its longest matching prefix in :data:`LAYERS`); an import,
at module level or inside a function, may only reach the same or a lower layer, and no two
modules import each other through any chain. ``docs/architecture.md`` explains the layers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Bottom to top. A package not listed here fails the test, so a new one gets a layer on purpose.
LAYERS: tuple[tuple[str, ...], ...] = (
    (
        "gradzip.errors",
        "gradzip.keys",
        "gradzip.checksum",
        "gradzip.buffers",
        "gradzip.state_file",
        "gradzip.choices",
    ),
    ("gradzip.accounting", "gradzip.optimizer_state"),
    ("gradzip.kernels",),
    ("gradzip.codecs",),
    ("gradzip.rng", "gradzip.payload", "gradzip.payload_batch", "gradzip.seed_schedule"),
    ("gradzip.comm",),
    ("gradzip.compressors",),
    ("gradzip.feedback",),
    ("gradzip.schemes",),
    ("gradzip.stepping",),
    ("gradzip.sync", "gradzip.optim"),
    ("gradzip.integrations",),
    ("gradzip.data", "gradzip.models"),
    ("gradzip.simulation",),
    ("gradzip.algorithms",),
    ("gradzip.bench", "gradzip.experiments", "gradzip.tables"),
    ("gradzip.cli", "gradzip.__main__"),
)
# The package's own ``__init__`` re-exports the public API of the layers below the application.
TOP_LEVEL_INIT_LAYER = "gradzip.integrations"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted((SRC / "gradzip").rglob("*.py"))}


def _layer(module: str) -> int:
    if module == "gradzip":
        module = TOP_LEVEL_INIT_LAYER
    best, best_len = -1, -1
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best < 0:
        raise AssertionError(f"{module} has no layer: add its package to LAYERS")
    return best


def _type_only_nodes(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (read by type checkers only)."""
    nodes: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            nodes.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return nodes


def _imports(module: str, runtime_only: bool = False) -> Iterator[tuple[str, int]]:
    """(imported gradzip module, line) for every import statement of ``module``; with
    ``runtime_only``, without the imports that only type checkers read."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text(), str(path))
    skipped = _type_only_nodes(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            targets = [stem] + [f"{stem}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target in MODULES and target != module:
                yield target, node.lineno


def _edges() -> dict[str, set[str]]:
    """Who imports whom when the code runs. A package's ``__init__`` importing its own
    submodules (re-exports) is not an edge; an import read only by type checkers (under
    ``if TYPE_CHECKING:``) is not either, since it cannot form an import cycle. Both still
    count for the layering above."""
    return {
        m: {t for t, _ in _imports(m, runtime_only=True) if not t.startswith(m + ".")}
        for m in MODULES
    }


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_reaches_a_higher_layer(module: str) -> None:
    upward = [
        f"line {line}: {target}"
        for target, line in _imports(module)
        if _layer(target) > _layer(module) and not target.startswith(module + ".")
    ]
    assert not upward, f"{module} imports a higher layer: {upward}"


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_cycle() -> None:
    assert _cycles(_edges()) == []


def test_no_package_cycle() -> None:
    def package(module: str) -> str:
        return ".".join(module.split(".")[:2])

    edges: dict[str, set[str]] = {package(m): set() for m in MODULES}
    for module, targets in _edges().items():
        edges[package(module)] |= {package(t) for t in targets if package(t) != package(module)}
    edges.pop("gradzip", None)  # the top-level __init__ re-exports; checked by its layer
    for targets in edges.values():
        targets.discard("gradzip")
    assert _cycles(edges) == []


def test_the_checker_sees_an_upward_edge_and_a_cycle() -> None:
    """The checks above can fail: a made-up graph with a cycle is found, and a lazy import
    inside a function counts as an import."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("gradzip.cli") > _layer("gradzip.compressors.qsgd")
    # reproduce.runs imports the backends inside a function only: _imports must report it
    runs = "gradzip.experiments.reproduce.runs"
    tree = ast.parse(MODULES[runs].read_text())
    top_level = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert "gradzip.experiments.backends" not in top_level
    assert "gradzip.experiments.backends" in {target for target, _ in _imports(runs)}


def _is_deprecated_alias(module: str) -> bool:
    """A module kept only so that an old import path keeps working (see CHANGELOG.md): it
    raises a ``DeprecationWarning`` when imported (a module-level ``warnings.warn``)."""
    for statement in ast.parse(MODULES[module].read_text()).body:
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            call = statement.value
            if ast.unparse(call.func) == "warnings.warn" and "DeprecationWarning" in {
                ast.unparse(arg) for arg in call.args
            }:
                return True
    return False


def deprecated_aliases() -> set[str]:
    """Every deprecated alias module of src/gradzip."""
    return {m for m in MODULES if _is_deprecated_alias(m)}


def test_nothing_in_src_imports_a_deprecated_alias() -> None:
    aliases = deprecated_aliases()
    assert aliases, "the deprecated aliases listed in CHANGELOG.md are gone: drop this test"
    users = [
        f"{module} imports {target}"
        for module in MODULES
        if module not in aliases
        for target, _ in _imports(module)
        if target in aliases
    ]
    assert not users
