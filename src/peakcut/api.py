"""The public entry points: capture, build, measure."""

from __future__ import annotations

from pathlib import Path

from peakcut.capture import capture
from peakcut.codegen.program import Step
from peakcut.ir.graph import Graph
from peakcut.runtime.measure import measure


def build(graph: Graph, order: list[int] | None = None, path: str | Path | None = None) -> Step:
    """A runnable step for `graph` in `order` (default: capture order).

    The generated source is written to `path` (default: a file under
    default_program_dir(), named by its hash) and imported from there.
    """
    return Step(graph, order=order, path=path)


__all__ = ["build", "capture", "measure"]
