"""The simulated figures beside the measured ones: what peakcut's models say of the same
steps, on the device's analytic profile (h100 or h200 by the GPU's name; h200 on a dry run)
and, from each plan's report, on the cost model optimize measured on the device.

- profile(): eager's step captured (make_fx over FakeTensors: nothing runs on the device) and
  each plan's program, simulated with peakcut's timeline on the analytic profile, with the
  workspace model of the graph's device (on a GPU: each call's scratch measured there).
- predicted(): the plan report's eager and plan figures (the search's own yardstick).
"""

from __future__ import annotations

from typing import Any

import torch

import peakcut
from peakcut.cost import get_cost_model
from peakcut.memory.workspace import describe_workspace
from peakcut.simulate import simulate_timeline
from peakcut.workloads import WorkloadInstance

REPORT_KEYS = ("eager_peak_bytes", "eager_latency_s", "eager_ratio", "peak_bytes", "peak_ratio", "latency_s",
               "latency_ratio", "memory_method", "latency_method")


def profile_name(device: str) -> str:
    """The analytic profile of the GPU named `device` (h200 where none matches)."""
    low = device.lower()
    return "h100" if "h100" in low else "h200"


def predicted(report: dict[str, Any]) -> dict[str, Any]:
    """The plan report's simulated figures (module doc)."""
    return {k: report.get(k) for k in REPORT_KEYS}


def profile(inst: WorkloadInstance, opt: torch.optim.Optimizer, plans: dict[str, tuple[Any, list[int]]],
            device: str) -> dict[str, Any]:
    """Eager and each plan ((graph, order) by limit) simulated on the device's analytic profile;
    ratios to eager's simulated figures."""
    name = profile_name(device)
    cost = get_cost_model(name)
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, opt)
    eager = simulate_timeline(g, g.order, cost, "auto")
    out: dict[str, Any] = {"profile": name, "method": f"simulated: {name} device profile on the peakcut timeline, "
                           f"{describe_workspace('auto', g.device)}",
                           "eager": {"peak_bytes": eager.peak_bytes, "latency_s": eager.latency_seconds}}
    for limit, (graph, order) in plans.items():
        t = simulate_timeline(graph, order, cost, "auto")
        out[limit] = {"peak_bytes": t.peak_bytes, "latency_s": t.latency_seconds,
                      "peak_ratio": t.peak_bytes / eager.peak_bytes if eager.peak_bytes else None,
                      "latency_ratio": t.latency_seconds / eager.latency_seconds if eager.latency_seconds else None}
    return out
