"""The one interface of peakcut's latency models, and how to get one by name.

Two sources implement it: analytic device profiles (peakcut.cost.analytic, figures in
peakcut.cost.profiles) and measurements on the local device (peakcut.cost.measured).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from peakcut.cost.analytic import AnalyticCostModel
from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.profiles import PROFILE_NAMES, get_profile
from peakcut.cost.protocol import CostModel, issue_seconds
from peakcut.ir.graph import Graph

MEASURED_SPECS: tuple[str, ...] = ("measured", "measured:cpu", "measured:cuda")
KNOWN_SPECS: tuple[str, ...] = (*PROFILE_NAMES, *MEASURED_SPECS)


def get_cost_model(spec: str, **kw: Any) -> CostModel:
    """The cost model named `spec`.

    Analytic: "rtx3090", "a100-80gb", "h100", "h200", "cpu" (also as "analytic:<name>");
    keyword tf32 (bool), and cpu_threads for "cpu" (default torch.get_num_threads()).
    Measured: "measured" (cuda when available, else cpu), "measured:cpu", "measured:cuda";
    keywords as MeasuredCostModel (cache_dir, settings, max_input_bytes, max_batch_bytes,
    line_overhead).
    Unknown specs raise ValueError naming the spec and listing the known ones.
    """
    name = spec.removeprefix("analytic:")
    if name in PROFILE_NAMES:
        tf32 = bool(kw.pop("tf32", False))
        threads = int(kw.pop("cpu_threads", torch.get_num_threads()))
        _no_more(spec, kw)
        return AnalyticCostModel(get_profile(name, cpu_threads=threads), tf32=tf32)
    if spec in MEASURED_SPECS:
        if spec == "measured":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        else:
            device = spec.partition(":")[2]
        return MeasuredCostModel(device, **kw)
    raise ValueError(f"unknown cost model {spec!r}; known: {', '.join(KNOWN_SPECS)}")


def _no_more(spec: str, kw: dict[str, Any]) -> None:
    if kw:
        raise TypeError(f"cost model {spec!r} takes no option(s) {', '.join(sorted(kw))}")


def step_seconds(cost: CostModel, g: Graph, order: Iterable[int] | None = None) -> float:
    """Sum of node_seconds and issue_seconds over `order` (default: capture order): every call
    run after the one before, no overlap."""
    return sum(cost.node_seconds(g, nid) + issue_seconds(cost, g, nid)
               for nid in (g.order if order is None else order))
