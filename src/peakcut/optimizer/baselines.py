"""Peers priced on peakcut's own yardstick: the same graph, cost model and timeline.

ZeRO-Offload-style (Ren et al., ATC'21, without its one-step delayed update): the optimizer
state lives in host memory and the update runs on the host; everything else is eager (the
capture order, the parameters on the device, every activation kept). It is peakcut's
host_update rule applied to every parameter and nothing else: each gradient goes to host
memory once made, the moments never come to the device, the update runs on the host stream
(priced on the host's profile: cost.profiles.host_profile) and each parameter's new value is
copied back. peakcut's plans are judged against it (bench.llm, the optimize report).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from peakcut.cost.protocol import CostModel
from peakcut.ir.graph import Graph
from peakcut.ir.tensor import Role
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.rules import RULES, Registry
from peakcut.rules.hotspot import HotspotSite
from peakcut.schedule.placement import place
from peakcut.simulate import simulate_timeline

ZERO_OFFLOAD = "zero-offload"


@dataclass(frozen=True)
class Baseline:
    """A peer's plan of one step, simulated: its peak, latency and what it did."""

    name: str
    description: str
    peak_bytes: int
    latency_s: float
    host_updated: int           # parameters whose update runs on the host
    refused: dict[str, str]     # parameter -> why its update stays on the device
    method: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def offload_plan(g: Graph, cost: CostModel, rules: Registry = RULES) -> tuple[Graph, list[int], dict[str, str]]:
    """The ZeRO-Offload-style program of step `g`, its order (host nodes placed under `cost`)
    and the parameters whose update stays on the device (name -> why)."""
    rule = rules.program_rule("host_update")
    params = [t for t in g.inputs if g.tensors[t].role is Role.PARAM]
    sites = [HotspotSite(t, -1, (), g.tensors[t].nbytes, 0) for t in params]
    rw, reasons = rule.apply_many(g, g.order, sites) if sites else (None, [])
    names = dict(zip(g.inputs, g.input_names, strict=True))
    refused = {names[t]: why for t, why in zip(params, reasons, strict=True) if why is not None}
    program, order = (rw.graph, rw.order) if rw is not None else (g, list(g.order))
    return program, place(program, order, cost, placements=rules.placements(program)), refused


def zero_offload(g: Graph, cost: CostModel, workspace: WorkspaceSpec = "auto",
                 rules: Registry = RULES) -> Baseline:
    """The ZeRO-Offload-style plan of step `g` (module docstring), simulated under `cost`."""
    program, order, refused = offload_plan(g, cost, rules)
    timeline = simulate_timeline(program, order, cost, workspace)
    params = [t for t in g.inputs if g.tensors[t].role is Role.PARAM]
    return Baseline(
        name=ZERO_OFFLOAD,
        description="optimizer state and update on the host, everything else eager",
        peak_bytes=timeline.peak_bytes,
        latency_s=timeline.latency_seconds,
        host_updated=len(params) - len(refused),
        refused=refused,
        method=f"simulated ({cost.name}, capture order, host ops on the host stream)",
    )
