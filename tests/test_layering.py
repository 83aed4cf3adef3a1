"""The packages of src/peakcut import only what docs/architecture.md's table allows.

The table ("Layers: who may import whom") has a row per package (`name/`) and per module at
the top of src/peakcut (`name.py`; `__init__.py` is the package `peakcut` itself), naming
what its files may import outside it. Imports are read as tests/test_imports.py reads them
(with `ast`, nothing imported): module-level, function-level and `if TYPE_CHECKING:`
imports all count. The test fails on every import the table does not allow, naming
the file, the line and the imported module; on a row for a package or module that does not
exist, and on one that exists without a row; and on a table whose rows form a cycle. It also
holds the table to the seams it exists for: only `optimizer/` imports `rules/` (besides
`rules/` itself), `codegen/` imports no rule, and `report/` imports nothing but `ir/`,
`memory/`, `simulate/`, `cost/` and `units.py`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_imports import ROOT, SRC, import_targets, module_files

DOC = Path(__file__).resolve().parents[1] / "docs" / "architecture.md"
HEADER = "| package or module | may import |"
NONE = "—"

Table = dict[str, frozenset[str]]


# ------------------------------------------------------------------ reading the table
def read_table(text: str) -> Table:
    """Unit -> the units it may import, from the markdown table whose header is HEADER."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == HEADER)
    except StopIteration:
        raise AssertionError(f"docs/architecture.md has no table headed {HEADER!r}") from None
    table: dict[str, frozenset[str]] = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2:
            raise AssertionError(f"table row {line!r}: expected two cells")
        unit = _names(cells[0], line)
        if len(unit) != 1:
            raise AssertionError(f"table row {line!r}: name one package or module in the first cell")
        (name,) = unit
        if name in table:
            raise AssertionError(f"table row {line!r}: {name} has a row already")
        table[name] = frozenset() if cells[1] == NONE else frozenset(_names(cells[1], line))
    return table


def _names(cell: str, line: str) -> list[str]:
    names = [part.strip() for part in cell.split(",")]
    if not all(re.fullmatch(r"`[A-Za-z_][A-Za-z0-9_]*(/|\.py)`", n) for n in names):
        raise AssertionError(f"table row {line!r}: {cell!r} is not a list of `package/` or `module.py` names")
    return [n.strip("`") for n in names]


# ------------------------------------------------------------------ units of the source tree
def unit_of(module: str, files: dict[str, Path], root: str = ROOT) -> str:
    """The table's name for the package or top-level module that `module` belongs to
    (`files`: module -> its file, as module_files gives them)."""
    parts = module.split(".")
    if parts == [root]:
        return "__init__.py"
    if len(parts) > 2 or files[module].name == "__init__.py":
        return f"{parts[1]}/"
    return f"{parts[1]}.py"


def units(src: Path = SRC, root: str = ROOT) -> set[str]:
    """Every package (`name/`) and top-level module (`name.py`) of src/root."""
    found = {"__init__.py"} if (src / root / "__init__.py").exists() else set()
    for path in (src / root).iterdir():
        if path.is_dir() and (path / "__init__.py").exists():
            found.add(f"{path.name}/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.add(path.name)
    return found


def violations(table: Table, src: Path = SRC, root: str = ROOT) -> list[str]:
    """'file:line imports module (unit may not import unit)' for every import the table does
    not allow; units without a row are reported by missing_rows, not here."""
    files = module_files(src, root)
    known = set(files)
    found = []
    for module, path in files.items():
        source = unit_of(module, files, root)
        allowed = table.get(source)
        if allowed is None:
            continue
        for line, target in import_targets(module, path, known):
            dest = unit_of(target, files, root)
            if dest != source and dest not in allowed:
                found.append(f"{path.relative_to(src)}:{line} imports {target} "
                             f"({source} may not import {dest})")
    return sorted(found)


def row_problems(table: Table, present: set[str]) -> list[str]:
    """Rows for units that do not exist, units without a row, names in a row that do not exist."""
    out = [f"the table has a row for {u}, which is not in src/peakcut" for u in sorted(set(table) - present)]
    out += [f"{u} is in src/peakcut but has no row in the table" for u in sorted(present - set(table))]
    for unit, allowed in sorted(table.items()):
        out += [f"{unit}'s row names {a}, which is not in src/peakcut" for a in sorted(allowed - present)]
        if unit in allowed:
            out.append(f"{unit}'s row names itself")
    return out


def table_cycle(table: Table) -> list[str]:
    """A cycle among the table's rows (['a/', 'b/', 'a/']), or [] when they form layers."""
    state: dict[str, int] = {}     # 1: on the path, 2: done
    path: list[str] = []

    def visit(u: str) -> list[str]:
        state[u] = 1
        path.append(u)
        for v in sorted(table.get(u, ())):
            if state.get(v) == 1:
                return [*path[path.index(v):], v]
            if v not in state and (cycle := visit(v)):
                return cycle
        path.pop()
        state[u] = 2
        return []

    for u in sorted(table):
        if u not in state and (cycle := visit(u)):
            return cycle
    return []


# ------------------------------------------------------------------ the checker itself
def test_checker_reads_the_table_and_names_each_import_it_does_not_allow(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    for sub in ("low", "high"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from pkg.high import mod\n")
    (pkg / "util.py").write_text("")
    (pkg / "high" / "mod.py").write_text("from pkg.low import a\nimport pkg.util\n")
    (pkg / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import mod\n"
        "def f():\n    from ..high import mod\n    return mod\n")
    doc = ("text\n\n| package or module | may import |\n|---|---|\n| `low/` | — |\n"
           "| `high/` | `low/`, `util.py` |\n| `__init__.py` | `high/` |\n| `gone/` | — |\n\nmore\n")
    table = read_table(doc)
    assert table == {"low/": frozenset(), "high/": frozenset({"low/", "util.py"}),
                     "__init__.py": frozenset({"high/"}), "gone/": frozenset()}
    assert units(tmp_path, "pkg") == {"__init__.py", "low/", "high/", "util.py"}
    assert violations(table, tmp_path, "pkg") == [
        "pkg/low/a.py:3 imports pkg.high.mod (low/ may not import high/)",   # TYPE_CHECKING counts
        "pkg/low/a.py:5 imports pkg.high.mod (low/ may not import high/)"]   # function-level counts
    assert row_problems(table, units(tmp_path, "pkg")) == [
        "the table has a row for gone/, which is not in src/peakcut",
        "util.py is in src/peakcut but has no row in the table"]
    assert table_cycle(table) == []
    assert table_cycle({"a/": frozenset({"b/"}), "b/": frozenset({"a/"})}) == ["a/", "b/", "a/"]
    with pytest.raises(AssertionError, match="not a list"):
        read_table("| package or module | may import |\n|---|---|\n| `a/` | b |\n")


# ------------------------------------------------------------------ the source tree
def _table() -> Table:
    return read_table(DOC.read_text())


def test_every_package_and_top_level_module_has_one_row() -> None:
    problems = row_problems(_table(), units())
    assert not problems, "docs/architecture.md's layering table:\n" + "\n".join(problems)


def test_the_table_forms_layers() -> None:
    cycle = table_cycle(_table())
    assert not cycle, "docs/architecture.md's layering table has a cycle: " + " -> ".join(cycle)


def test_every_import_is_one_the_table_allows() -> None:
    found = violations(_table())
    assert not found, ("imports docs/architecture.md's layering table does not allow:\n"
                       + "\n".join(found))


def test_the_table_keeps_the_seams() -> None:
    table = _table()
    importers_of_rules = {u for u, allowed in table.items() if "rules/" in allowed}
    assert importers_of_rules == {"optimizer/"}, "only optimizer/ may import rules/ (and its registry)"
    assert "rules/" not in table["codegen/"], "codegen/ imports no rule"
    assert table["report/"] <= {"ir/", "memory/", "simulate/", "cost/", "units.py"}, \
        "report/ is a leaf: drawing and tables over ir, memory, simulate, cost and units"
    assert "capture/" not in table["codegen/"] | table["runtime/"], "running a step needs no capture"
