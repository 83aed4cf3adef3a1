"""No import cycle inside src/peakcut.

The test reads every module of the source tree with `ast` (nothing is imported) and draws an
edge A -> B for each `import B` / `from B import x` in A that names a peakcut module (for
`from pkg import name`, the submodule pkg.name when there is one, else pkg; relative imports
resolved). What counts:

- module-level and function-level imports alike: an import deferred into a function still
  ties the two modules together (each needs the other to work), it only hides the cycle from
  the interpreter's import order; a deferred import is no way out of a cycle here;
- imports under `if TYPE_CHECKING:` count too: they never run, but a reader (and the type
  checker) of one module needs the other, so the two are as tied as by any import;
- an import names its module only, not the packages above it: `import peakcut.ir.graph` runs
  `peakcut/__init__.py` too, but a package `__init__` that re-exports its submodules is not a
  dependency of those submodules.

Cycles are reported as paths A -> B -> ... -> A that together pass through every module on a
cycle: per strongly connected component, a shortest cycle through its first module not yet
on a reported one, until all are (each path starts at its first module in sorted order).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "peakcut"


def module_files(src: Path = SRC, root: str = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under src/root."""
    out: dict[str, Path] = {}
    for path in sorted((src / root).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in the tree, at any depth (under `if TYPE_CHECKING:` too)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_targets(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, peakcut module) for each module `module` (its source at `path`) imports, as
    defined above, once per import statement that names it; sorted."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[tuple[int, str]] = set()
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            found.update((node.lineno, alias.name) for alias in node.names if alias.name in known)
            continue
        target = _absolute(module, is_package, node)
        for alias in node.names:
            sub = f"{target}.{alias.name}"
            if sub in known:
                found.add((node.lineno, sub))
            elif target in known:
                found.add((node.lineno, target))
    return sorted((line, m) for line, m in found if m != module)


def imported_modules(module: str, path: Path, known: set[str]) -> set[str]:
    """The peakcut modules `module` (its source at `path`) imports, as defined above."""
    return {m for _, m in import_targets(module, path, known)}


def import_graph(src: Path = SRC, root: str = ROOT) -> dict[str, set[str]]:
    files = module_files(src, root)
    known = set(files)
    return {m: imported_modules(m, p, known) for m, p in files.items()}


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted, in sorted order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            v, successors = work[-1]
            advanced = False
            for w in successors:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    advanced = True
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                components.append(sorted(component))
    return sorted(components)


def shortest_cycle(graph: dict[str, set[str]], component: list[str], start: str) -> list[str]:
    """A shortest cycle through `start`, inside its strongly connected component."""
    inside = set(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise ValueError(f"{component} holds no cycle through {start}")


def import_cycles(graph: dict[str, set[str]]) -> list[str]:
    """'A -> B -> ... -> A' lines covering every module on a cycle (module docstring); sorted."""
    found: set[str] = set()
    for component in strongly_connected(graph):
        if len(component) < 2:
            continue
        covered: set[str] = set()
        for start in component:
            if start in covered:
                continue
            cycle = shortest_cycle(graph, component, start)[:-1]
            covered.update(cycle)
            first = cycle.index(min(cycle))
            rotated = cycle[first:] + cycle[:first]
            found.add(" -> ".join([*rotated, rotated[0]]))
    return sorted(found)


# ------------------------------------------------------------------ the checker itself
def test_checker_finds_module_and_function_level_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("def f():\n    from .. import a\n    return a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import d\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.b"] == {"pkg.a"}        # function-level, relative
    assert graph["pkg.c"] == {"pkg.d"}            # TYPE_CHECKING counts
    assert graph["pkg"] == {"pkg.a"}              # from package import submodule
    assert import_cycles(graph) == ["pkg.a -> pkg.sub.b -> pkg.a", "pkg.c -> pkg.d -> pkg.c"]


# ------------------------------------------------------------------ the source tree
def test_no_import_cycle_in_peakcut() -> None:
    cycles = import_cycles(import_graph())
    assert not cycles, "import cycles in src/peakcut:\n" + "\n".join(cycles)
