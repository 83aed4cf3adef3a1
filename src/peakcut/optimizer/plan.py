"""An optimized step: run it, read its report and source, save it, load it back.

    plan.step(batch)          # one optimized step on real data (parameters updated in place)
    plan.report               # dict: before/after peak and latency, how each was obtained, what was applied
    plan.source               # the generated program
    plan.save("out/plan"); peakcut.load_plan("out/plan", model)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from peakcut.codegen.program import Step
from peakcut.ir.graph import Graph

PLAN_FILES = ("graph.json", "order.json", "report.json", "program.py")


class LimitNotMet(RuntimeError):
    """The limit could not be met within the time budget; `.plan` is the best plan found."""

    def __init__(self, message: str, plan: Plan) -> None:
        super().__init__(message)
        self.plan = plan


class Plan:
    """A program (graph + order) for one model, with its report."""

    def __init__(self, model: torch.nn.Module, graph: Graph, order: list[int], report: dict[str, Any]) -> None:
        self.model = model
        self.graph = graph
        self.order = list(order)
        self.report = report
        self._step: Step | None = None

    @property
    def program(self) -> Step:
        """The runnable step (generated and imported on first use)."""
        if self._step is None:
            self._step = Step(self.graph, self.order, title=self.report.get("title", "peakcut plan"))
        return self._step

    @property
    def source(self) -> str:
        return self.program.source

    def step(self, batch: Any) -> Any:
        """Run one optimized step on `batch`: returns the loss (or the model output)."""
        return self.program(self.model, batch)

    def save(self, path: str | Path) -> Path:
        """Write graph, order, report and program source into directory `path`."""
        out = Path(path)
        out.mkdir(parents=True, exist_ok=True)
        (out / "graph.json").write_text(self.graph.to_json())
        (out / "order.json").write_text(json.dumps(self.order))
        (out / "report.json").write_text(json.dumps(self.report, indent=2, default=str))
        (out / "program.py").write_text(self.source)
        return out

    def __repr__(self) -> str:
        r = self.report
        return (f"Plan(peak {r.get('peak_bytes', 0) / 2**30:.3f} GiB vs eager "
                f"{r.get('eager_peak_bytes', 0) / 2**30:.3f} GiB, latency {r.get('latency_s', 0):.4g} s vs "
                f"{r.get('eager_latency_s', 0):.4g} s, {len(r.get('applied', []))} rewrites)")


def load_plan(path: str | Path, model: torch.nn.Module) -> Plan:
    """A saved plan, bound to `model` (the same architecture and parameter shapes)."""
    src = Path(path)
    missing = [name for name in PLAN_FILES[:3] if not (src / name).exists()]
    if missing:
        raise FileNotFoundError(f"{src} is not a saved plan: missing {', '.join(missing)}")
    graph = Graph.from_json((src / "graph.json").read_text())
    order = json.loads((src / "order.json").read_text())
    report = json.loads((src / "report.json").read_text())
    if sorted(order) != sorted(graph.nodes):
        raise ValueError(f"{src / 'order.json'} does not order the nodes of {src / 'graph.json'}")
    return Plan(model, graph, order, report)
