"""peakcut's rows: the optimizer in both modes, judged like every peer.

- tiny (measured): `peakcut.optimize` with per-op times measured on this CPU
  (device "measured"), then the plan's step runs for real on the harness's model copy;
  the harness warms it up, times it and measures its peak as for the peers. The plan's
  optimizer state lives in the step (`Step.state`): `held()` hands it to the harness,
  which counts it with the caller-held bytes, as it counts torch.optim's state.
- paper (simulated): `optimize_graph` on the captured step under the RTX 3090 profile;
  the harness simulates the plan's (graph, order) with the same simulator and device
  profiles as the peers.
A limit that cannot be met still gives the best plan found (noted in the cell).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import peakcut
from peakcut import Graph
from peakcut.optimizer import LimitNotMet, optimize_graph
from peakcut.workloads import WorkloadInstance

TINY_BUDGET = 20.0     # seconds per tiny search (measured per-op costs)
PAPER_BUDGET = 30.0    # seconds per paper-size search
PAPER_DEVICE = "rtx3090"
LIMITS = ("memory 0.5", "latency 1.1")


def _limit(limit: str) -> dict[str, float]:
    mode, value = limit.split()
    return {"memory_limit": float(value)} if mode == "memory" else {"latency_limit": float(value)}


def peakcut_step(limit: str, inst: WorkloadInstance, model: torch.nn.Module
                 ) -> tuple[Callable[[], Any], Callable[[], list[torch.Tensor]], str]:
    """(step on `model`, the tensors the step holds between calls, a note) for a tiny workload."""
    note = ""
    try:
        plan = peakcut.optimize(model, inst.batch, inst.loss_fn, "adamw", device="measured",
                                time_budget=TINY_BUDGET, **_limit(limit))
    except LimitNotMet as e:
        plan, note = e.plan, "limit not met: best plan"
    step = plan.program
    r = plan.report
    note = "; ".join(x for x in (note, f"{len(r['applied'])} rewrites, {r['search']['states']} states") if x)

    def run() -> None:
        step(model, inst.batch)

    return run, lambda: list(step.state.values()), note


def peakcut_graph(limit: str, inst: WorkloadInstance) -> tuple[Graph, list[int]]:
    """The optimized plan of `inst` (paper size, meta device) as (graph, order)."""
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    found = optimize_graph(g, time_budget=PAPER_BUDGET, device=PAPER_DEVICE, **_limit(limit))
    return found.best.program, found.best.order
