"""The import graph of ``bench/``, ``methods/`` and ``datasets/``, read from the source
with ``ast`` (every import at any depth: module level, inside functions, under ``if``
and ``if TYPE_CHECKING:`` alike; relative imports resolved), has no circle; the core
(``bench/``) never imports ``methods/`` or ``datasets/`` (the registries are its only
link to them, docs/architecture.md); the layers of a run, cli > runner > executors > cell > train,
import only downwards; and the suite spec, analysis and report need none of them."""
from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO

CORE, PLUGINS = "bench", ("methods", "datasets")
PACKAGES = (CORE, *PLUGINS)
# the run, top to bottom: parse and dispatch, plan, where cells run, one cell, the training loop
RUN_LAYERS = ("bench.run.cli", "bench.run.runner", "bench.run.executors", "bench.train.cell", "bench.train.loop")


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the three packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that the module ``name`` (file ``path``) imports: for
    ``from a.b import c`` the submodule ``a.b.c`` when it is one, else ``a.b``; a name not
    among ``known`` (stdlib, torch, ...) is reduced to its longest known prefix, if any."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()

    def add(target: str) -> None:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            out.add(target)

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # from . import x, from ..a import b
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parent + ([node.module] if node.module else []))
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                add(full if full in known else base)
    return out


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _top(module: str) -> str:
    return module.partition(".")[0]


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module ``start`` imports, directly or through others."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_graph_is_read_from_every_file():
    """The graph holds every module of the three packages, and edges the code is known
    to have (a sanity check of the reader: a graph without edges has no circle either)."""
    graph = import_graph()
    for package in PACKAGES:
        assert package in graph and any(m.startswith(f"{package}.") for m in graph)
    assert "bench.core.registry" in graph["methods.msp"]
    assert "bench.core.errors" in graph["bench.core.registry"]
    assert {"methods.deep_ensemble", "methods.msp"} <= graph["methods"]  # from methods import (...)


def test_no_import_circle():
    graph = import_graph()
    found = circles(graph)
    lines = [f"{len(c)} modules: " + ", ".join(c) + "\n    " +
             "\n    ".join(f"{a} -> {b}" for a in c for b in sorted(graph[a] & set(c))) for c in found]
    assert not found, "import circles:\n  " + "\n  ".join(lines)


def test_the_core_never_imports_methods_or_datasets():
    """``bench/`` reaches methods and data sets through the registries only (built-in
    ones loaded by name, as plugins are: ``bench.core.registry``)."""
    upward = sorted(f"{m} -> {t}" for m, targets in import_graph().items() if _top(m) == CORE
                    for t in targets if _top(t) in PLUGINS)
    assert not upward, "the core imports methods/ or datasets/:\n  " + "\n  ".join(upward)


def test_each_run_layer_imports_only_the_layers_below_it():
    """Directly or through other modules: the runner dispatches to the executors, which
    run the cell, which trains; none of them reaches back up."""
    graph = import_graph()
    for i, layer in enumerate(RUN_LAYERS):
        above = set(RUN_LAYERS[:i]) & reachable(graph, layer)
        assert not above, f"{layer} imports, directly or not, the layer(s) above it: {sorted(above)}"


def test_the_suite_spec_and_the_analysis_need_no_run_layer():
    """A suite is parsed and checked without the executors (its ``[executor]`` table is
    :mod:`bench.config.executor_config`); analysis and report read the store, never a model."""
    graph = import_graph()
    run = set(RUN_LAYERS) | {"bench.train.method", "bench.train.vit"}
    checked = [m for m in graph if any(m == p or m.startswith(f"{p}.") for p in (
        "bench.config.spec", "bench.store.plan", "bench.store.catalog", "bench.analysis", "bench.analysis.bootstrap", "bench.metrics", "bench.report"))]
    assert {"bench.config.spec", "bench.store.plan", "bench.report"} <= set(checked)
    needs = {m: sorted(run & reachable(graph, m)) for m in checked if run & reachable(graph, m)}
    assert not needs, f"modules that import run layers, directly or not: {needs}"


# bench's stage packages, top to bottom: a package imports only the packages after it
STAGES = ("bench.run", "bench.train", "bench.report", "bench.analysis", "bench.scores", "bench.store", "bench.config",
          "bench.metrics", "bench.data", "bench.core")


def _stage(module: str) -> str | None:
    return next((s for s in STAGES if module == s or module.startswith(f"{s}.")), None)


def test_bench_holds_stage_packages_only():
    """``bench/``'s root holds packages (and its empty ``__init__``), each one of STAGES."""
    root = REPO / CORE
    loose = sorted(p.name for p in root.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules at bench/'s root, outside a stage package: {loose}"
    assert not (root / "__init__.py").read_text().strip()
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert packages == {s.partition(".")[2] for s in STAGES}


def test_each_stage_package_imports_only_the_packages_below_it():
    graph = import_graph()
    upward = sorted(f"{m} -> {t}" for m, targets in graph.items() if _stage(m)
                    for t in targets if _stage(t) and STAGES.index(_stage(t)) < STAGES.index(_stage(m)))
    assert not upward, "imports that run up the stage packages:\n  " + "\n  ".join(upward)
