"""The house rules the repository's text and layout keep (docs/design.md, docs/architecture.md).

- README.md is a user's guide of at most 15 KB and BENCHMARKS.md one results page of at most
  40 KB; depth lives in docs/ and raw outputs under bench/.
- No numbered reference to past work or to an issue, no dated run history, no commit hash in
  prose and no citation of notes outside the repository, in src/ (comments and strings),
  docs/, README.md or BENCHMARKS.md: history lives in git.
- No source file under src/peakcut is longer than 500 lines.
- Every package's docstring names every module of its package, so a newcomer finds each
  file's job from the package's face.

Every failure names the file and the line.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "peakcut"

README_LIMIT = 15_000       # bytes: 15 KB, decimal (the stricter reading)
BENCHMARKS_LIMIT = 40_000   # bytes: 40 KB, decimal
MAX_LINES = 500

HISTORY = {
    "a numbered issue": re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE),
    "a numbered session": re.compile(r"\bsessions?\s+\d+", re.IGNORECASE),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a path outside the repository": re.compile(r"\.\./shared"),
    "a design note outside the repository": re.compile(r"\bDESIGN\s+invariants?\b|\bnotes\s+§"),
}
# a commit hash: 7-40 hex digits with at least one digit and one letter (not a word, not a number)
COMMIT = re.compile(r"(?<![\w.#/-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


def _documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _sources() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _prose_of_python(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and string literal of a Python file: its prose."""
    source = path.read_text(encoding="utf-8")
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.COMMENT, tokenize.STRING):
            for k, text in enumerate(tok.string.splitlines()):
                yield tok.start[0] + k, text


def _lines_of(path: Path) -> Iterator[tuple[int, str]]:
    if path.suffix == ".py":
        yield from _prose_of_python(path)
    else:
        yield from enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)


def _history_hits(path: Path) -> list[str]:
    hits = []
    for line, text in _lines_of(path):
        for what, pattern in HISTORY.items():
            m = pattern.search(text)
            if m:
                hits.append(f"{_rel(path)}:{line}: {what} ({m.group(0)!r}): {text.strip()[:120]}")
        m = COMMIT.search(text)
        if m:
            hits.append(f"{_rel(path)}:{line}: a commit hash ({m.group(0)!r}): {text.strip()[:120]}")
    return hits


def test_readme_is_a_short_guide() -> None:
    size = (ROOT / "README.md").stat().st_size
    assert size <= README_LIMIT, f"README.md:1: {size} bytes, more than {README_LIMIT}: move depth to docs/"


def test_benchmarks_is_one_results_page() -> None:
    size = (ROOT / "BENCHMARKS.md").stat().st_size
    assert size <= BENCHMARKS_LIMIT, (f"BENCHMARKS.md:1: {size} bytes, more than {BENCHMARKS_LIMIT}: keep the "
                                      "current figures, raw outputs under bench/")


def test_documents_carry_no_history() -> None:
    hits = [h for path in _documents() for h in _history_hits(path)]
    assert not hits, "history in the documents (it lives in git):\n" + "\n".join(hits)


def test_sources_carry_no_history() -> None:
    hits = [h for path in _sources() for h in _history_hits(path)]
    assert not hits, "history in src/ (it lives in git):\n" + "\n".join(hits)


def test_no_source_file_is_too_long() -> None:
    long = []
    for path in _sources():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > MAX_LINES:
            long.append(f"{_rel(path)}:{n}: {n} lines, more than {MAX_LINES}: split it by job")
    assert not long, "\n".join(long)


def _names(doc: str, module: str) -> bool:
    return re.search(rf"(?<![\w.]){re.escape(module)}(\.py)?(?!\w)", doc) is not None


def test_package_docstrings_name_every_module() -> None:
    missing = []
    for init in sorted(SRC.rglob("__init__.py")):
        package = init.parent
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        for module in sorted(package.glob("*.py")):
            if module.name in ("__init__.py", "__main__.py"):
                continue
            if not _names(doc, module.stem):
                missing.append(f"{_rel(init)}:1: the docstring does not name {module.name}")
    assert not missing, "package docstrings that miss files:\n" + "\n".join(missing)


def test_the_history_patterns_catch_what_they_are_for() -> None:
    caught = ["see issue 18", "(session 44)", "run on 2026-11-28", "at c9def63", "../shared/DESIGN.md",
              "DESIGN invariants 2 and 4", "notes §4", "Issue #17"]
    passed = ["in issue order", "a session with profile_memory=True", "0x1f2e3d4c", "1234567", "deadbeef",
              "sha256", "float32", "the 2-core VM", "h200-x1", "bench/gpu_runs/"]
    for text in caught:
        assert any(p.search(text) for p in HISTORY.values()) or COMMIT.search(text), text
    for text in passed:
        assert not any(p.search(text) for p in HISTORY.values()) and not COMMIT.search(text), text
