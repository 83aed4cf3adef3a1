"""The public entry points: capture, build, measure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from peakcut.capture import capture
from peakcut.codegen.program import Step
from peakcut.ir.graph import Graph
from peakcut.runtime.measure import measure


def build(graph: Graph, order: list[int] | None = None, path: str | Path | None = None, *,
          optimizer: torch.optim.Optimizer | None = None, scaler: Any = None) -> Step:
    """A runnable step for `graph` in `order` (default: capture order).

    The generated source is written to `path` (default: a file under
    default_program_dir(), named by its hash) and imported from there. optimizer: the
    torch.optim optimizer the graph was captured with (its state and param_groups are used
    at every call; default: a fresh one made from the captured description); scaler: the
    GradScaler, for a step captured with one.
    """
    return Step(graph, order=order, path=path, optimizer=optimizer, scaler=scaler)


__all__ = ["build", "capture", "measure"]
