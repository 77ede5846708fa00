"""The import graph of ``src/gradzip`` (the library) and ``src/gradzip_lab`` (the paper lab) is
layered and acyclic, and the library never imports the lab.

Every module belongs to a layer (by its longest matching prefix in :data:`LAYERS`); an import,
at module level, inside a function or for type checkers only, may only reach the same or a
lower layer, and no two modules import each other through any chain of such imports. The lab is the top layer: it may import the
library, and no library module may import it in any way (at module level, inside a function or
under ``TYPE_CHECKING``). ``docs/architecture.md`` explains the layers.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
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
        "gradzip.finite",
        "gradzip.flat_views",
        # the one sanctioned device-to-host read, which the bit accounting's verify() uses
        "gradzip.device.host_reads",
    ),
    ("gradzip.accounting", "gradzip.optimizer_state"),
    ("gradzip.kernels",),
    ("gradzip.codecs",),
    ("gradzip.rng", "gradzip.payload", "gradzip.payload_batch", "gradzip.seed_schedule"),
    ("gradzip.device",),
    ("gradzip.comm",),
    ("gradzip.compressors",),
    ("gradzip.feedback",),
    ("gradzip.schemes",),
    ("gradzip.stepping",),
    ("gradzip.sync", "gradzip.optim", "gradzip.warmup"),
    ("gradzip.integrations",),
    ("gradzip.data", "gradzip.models"),
    ("gradzip.simulation",),
    ("gradzip.algorithms",),
    ("gradzip.experiments",),
    ("gradzip.cli", "gradzip.__main__"),
    # the paper lab, never imported by the library (test_the_library_never_imports_the_lab)
    ("gradzip_lab", "gradzip_lab.bench"),
    ("gradzip_lab.reproduce",),
    ("gradzip_lab.cli",),
)
LIBRARY, LAB = "gradzip", "gradzip_lab"
# The package's own ``__init__`` re-exports the public API of the layers below the application.
TOP_LEVEL_INIT_LAYER = "gradzip.integrations"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {
    _module_name(p): p for package in (LIBRARY, LAB) for p in sorted((SRC / package).rglob("*.py"))
}


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


def _parse_imports(
    source: str, module: str, is_package: bool, known: Collection[str] | None
) -> Iterator[tuple[str, int]]:
    """(imported module among ``known``, line) for every import statement of ``module``'s
    ``source``: at module level, inside a function, or under ``if TYPE_CHECKING:`` alike. With
    ``known`` None, every name an import reaches, module or not (``from a import b``: ``a`` and
    ``a.b`` both)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source, module)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # ``from package import submodule`` imports the submodule (its package's
            # ``__init__`` runs first whatever is imported, so that is no edge of its own)
            submodules = [f"{stem}.{alias.name}" for alias in node.names]
            names_only = known is None or any(name not in known for name in submodules)
            targets = ([stem] if names_only else []) + submodules
        else:
            continue
        for target in targets:
            if (known is None or target in known) and target != module:
                yield target, node.lineno


def _imports(module: str) -> Iterator[tuple[str, int]]:
    """(imported gradzip or gradzip_lab module, line) for every import statement of ``module``."""
    path = MODULES[module]
    return _parse_imports(path.read_text(), module, path.name == "__init__.py", MODULES)


def _edges() -> dict[str, set[str]]:
    """Who imports whom, for the cycle checks: every import counts, a lazy one inside a
    function, one read only by type checkers (under ``if TYPE_CHECKING:``) and a package's
    ``__init__`` importing its own submodules (re-exports) included. [CHOICE] A type-only
    import cannot break the program at run time, but a circle through it is still two modules
    that each need the other to be understood: the layering should put one below the other."""
    return {m: {t for t, _ in _imports(m)} for m in MODULES}


def _lab_imports(module: str, source: str | None = None) -> list[str]:
    """``line N: name`` for every import of ``module`` that reaches the lab, however it is
    written and wherever it stands (a function body, ``if TYPE_CHECKING:``)."""
    return [
        f"line {line}: {target}"
        for target, line in _parse_imports(
            MODULES[module].read_text() if source is None else source,
            module,
            module in MODULES and MODULES[module].name == "__init__.py",
            None,
        )
        if target == LAB or target.startswith(LAB + ".")
    ]


def _is_library(module: str) -> bool:
    return module == LIBRARY or module.startswith(LIBRARY + ".")


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _is_library(m)))
def test_the_library_never_imports_the_lab(module: str) -> None:
    assert not _lab_imports(module), f"{module} imports the lab: {_lab_imports(module)}"


def test_the_lab_check_catches_every_way_to_import_the_lab() -> None:
    """A made-up library module that imports the lab at module level, in a function and under
    ``TYPE_CHECKING`` fails the check once per import; the same module without them passes."""
    made_up = "gradzip.compressors.made_up"
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
import gradzip_lab
from gradzip_lab.bench import timing
if TYPE_CHECKING:
    from gradzip_lab.reproduce.outcome import Row
def run() -> None:
    import gradzip_lab.reproduce as registry
    from gradzip_lab import cli
"""
    assert _lab_imports(made_up, source) == [
        "line 4: gradzip_lab",
        "line 5: gradzip_lab.bench",
        "line 5: gradzip_lab.bench.timing",
        "line 7: gradzip_lab.reproduce.outcome",
        "line 7: gradzip_lab.reproduce.outcome.Row",
        "line 9: gradzip_lab.reproduce",
        "line 10: gradzip_lab",
        "line 10: gradzip_lab.cli",
    ]
    assert _lab_imports(made_up, "import gradzip\nfrom gradzip.cli import main\n") == []
    # relative imports resolve: a lab module's `from . import x` is the lab's
    assert _lab_imports("gradzip_lab.bench.timing", "from . import cluster\n") == [
        "line 1: gradzip_lab.bench",
        "line 1: gradzip_lab.bench.cluster",
    ]
    # and the layers put every lab module above every library module
    library = [_layer(m) for m in MODULES if _is_library(m)]
    assert min(_layer(m) for m in MODULES if not _is_library(m)) > max(library)


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
    """The checks above can fail: a made-up graph with a cycle is found, a lazy import inside a
    function counts as an import, and so does a type-only one (two made-up modules importing
    each other, one under ``if TYPE_CHECKING:``, the other inside a function, are a cycle)."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    sources = {
        "fake.a": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from fake.b import B\n",
        "fake.b": "def f() -> None:\n    from fake import a\n",
        "fake.c": "import fake.a\n",
    }
    edges = {
        m: {t for t, _ in _parse_imports(s, m, False, set(sources))} for m, s in sources.items()
    }
    assert edges == {"fake.a": {"fake.b"}, "fake.b": {"fake.a"}, "fake.c": {"fake.a"}}
    assert _cycles(edges) == [["fake.a", "fake.b"]]
    assert _layer("gradzip.cli") > _layer("gradzip.compressors.qsgd")
    # reproduce.runs imports the backends inside a function only: _imports must report it
    runs = "gradzip_lab.reproduce.runs"  # the lab's imports are checked as the library's
    tree = ast.parse(MODULES[runs].read_text())
    top_level = {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert "gradzip.experiments.backends" not in top_level
    assert "gradzip.experiments.backends" in {target for target, _ in _imports(runs)}
