"""The report optimize_graph returns: the limit and whether the plan meets it, the eager and
the plan's figures and how they were made (its arena and predicted reserved bytes:
optimizer.arena), the floors and the ZeRO-Offload-style peer, the
F-Tree, the search's effort and front; where a memory limit is missed, what stands at the
plan's peak and the whole-op floor; and the step optimize captured. Where the time went
(report["phases"]) is optimizer.phases."""

from __future__ import annotations

import math
import time
from typing import Any

from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.profiles import DeviceProfile
from peakcut.cost.protocol import CostModel
from peakcut.ir.graph import Graph
from peakcut.memory.workspace import WorkspaceSpec, describe_workspace
from peakcut.optimizer.arena import arena_entries, layout_seconds
from peakcut.optimizer.baselines import zero_offload
from peakcut.optimizer.budget import BudgetedCost
from peakcut.optimizer.floors import Floors, step_floors
from peakcut.optimizer.held_floor import HeldFloor, WholeOpFloor, whole_op_floor
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.peak_standing import peak_standing
from peakcut.optimizer.search import SearchResult
from peakcut.optimizer.state import State
from peakcut.simulate import Timeline, simulate_timeline
from peakcut.spec.optimizers import OptimizerSpec


def step_floors_for(g: Graph, cost: CostModel, workspace: WorkspaceSpec) -> Floors | None:
    """The step's physical floors on an analytic device profile (optimizer.floors); None for a
    measured cost model, which has no peak figures to price them with."""
    profile = getattr(cost, "profile", None)
    if not isinstance(profile, DeviceProfile):
        return None
    return step_floors(g, profile, workspace=workspace, tf32=bool(getattr(cost, "tf32", False)))


def zero_offload_peer(g: Graph, cost: CostModel, workspace: WorkspaceSpec, floors: Floors | None) -> dict[str, Any] | None:
    """The ZeRO-Offload-style peer on the same yardstick (optimizer.baselines), where a host link
    is priced: an analytic GPU profile whose copies overlap compute (None elsewhere)."""
    if floors is None or not cost.overlap_copies or g.signature.mode == "inference":
        return None
    return zero_offload(g, cost, workspace).as_dict()


def methods(cost: CostModel, workspace: WorkspaceSpec) -> tuple[str, str]:
    """How the report's memory and latency figures were made: simulated, measured or estimated."""
    memory = f"simulated: peakcut timeline (compute + copy streams), {describe_workspace(workspace)}"
    name = cost.name
    if name.startswith("measured"):
        latency = f"simulated from per-op times measured on this machine ({name}), on the peakcut timeline"
        measured = cost.measured if isinstance(cost, BudgetedCost) else cost
        if isinstance(measured, MeasuredCostModel) and measured.context != 1.0:
            latency += (f", each call x{measured.context:.3f} for running inside the whole step "
                        "(the untransformed step measured here; report['context'])")
        if isinstance(cost, BudgetedCost) and cost.fitted:
            latency += (f"; {cost.fitted} calls the search priced were not measured within the time budget: "
                        "priced from the measured calls of their op (fitted prices, peakcut.cost.fitted; "
                        "the plan's in report['repriced'])")
    else:
        latency = f"simulated: {name} device profile on the peakcut timeline"
    return memory, latency


def estimate(best: State) -> dict[str, float] | None:
    """The search's compact-expansion figures of the best, when it was re-derived in full."""
    found = best.compact_estimate
    return None if found is None else {"peak_bytes": found[0], "latency_s": found[1]}


def plan_entries(state: State, eager: Timeline, eager_ratio: float = 1.0) -> dict[str, Any]:
    """The report's entries that describe the plan `state` (predicted figures, what it does:
    its rewrites, fission regions and recipes; and `applied`, the search's path to it, undos
    and dropped recipes included); latency_ratio is to the user's eager step (eager_ratio x
    the captured step's time)."""
    return {"peak_bytes": state.peak_bytes, "peak_ratio": state.peak_bytes / eager.peak_bytes,
            "latency_s": state.latency_s,
            "latency_ratio": state.latency_s / (eager_ratio * eager.latency_seconds) if eager.latency_seconds else None,
            "applied": list(state.applied),
            "rewrites": list(state.rewrites),
            "fission": [{"ftree_node": k, "n": n, "ops": len(state.tree.nodes[k].nodes)} for k, n in state.fission()],
            "recipes": [r.description for r in state.recipes]}


def search_report(g: Graph, cost: CostModel, workspace: WorkspaceSpec, objective: Objective, planned: Objective,
                  eager: Timeline, eager_ratio: float, floors: Floors | None, peer: dict[str, Any] | None,
                  tree_summary: Any, result: SearchResult, *, plan_margin: float, polish_s: float,
                  time_budget: float, seed: int, t0: float, host_keeps_freed: bool = False) -> dict[str, Any]:
    """The report of a search on `g` whose best is result.best (module doc); `planned` is the
    objective the search planned to (the limit less `plan_margin`), `t0` when the call began;
    host_keeps_freed: the CPU allocator the reserved bytes are predicted for (optimizer.arena)."""
    memory_method, latency_method = methods(cost, workspace)
    best = result.best
    return {
        "device": cost.name,
        "mode": objective.mode,
        "limit": objective.limit if math.isfinite(objective.limit) else None,
        "feasible": objective.feasible(best.peak_bytes, best.latency_s),
        "eager_peak_bytes": eager.peak_bytes,
        "eager_latency_s": eager.latency_seconds,
        "eager_ratio": eager_ratio,
        **plan_entries(best, eager, eager_ratio),
        **arena_entries(best.program, best.order, cost, workspace, layout_seconds(time_budget), host_keeps_freed),
        "memory_method": memory_method,
        "latency_method": latency_method,
        "capture_notes": list(g.signature.notes),
        "floors": floors.as_dict() if floors is not None else None,
        "overhead_vs_compute_floor": floors.overhead(best.latency_s) if floors is not None else None,
        "zero_offload": peer,
        "ftree": tree_summary,
        "search": {"states": result.states, "expanded": result.expanded, "duplicates": result.duplicates,
                   "failed": result.failed, "seconds": round(result.seconds, 3),
                   "states_per_minute": round(result.states_per_minute, 1), "stopped": result.stopped,
                   "jobs": result.jobs, "plan_margin": plan_margin if planned is not objective else 0.0,
                   "compact_estimate": estimate(best), "polish_s": round(polish_s, 3),
                   "time_budget_s": time_budget, "seed": seed, "total_seconds": round(time.perf_counter() - t0, 3)},
        "front": [{"peak_bytes": s.peak_bytes, "latency_s": s.latency_s, "applied": len(s.applied),
                   "exact": s.exact} for s in result.front],
    }


def note_shortfall(report: dict[str, Any], g: Graph, objective: Objective, best: State,
                   unreachable: HeldFloor | None, cost: CostModel, simulated: WorkspaceSpec, device_name: str,
                   workspace: WorkspaceSpec, rewritten_root: State | None) -> None:
    """Add to `report` why the plan misses a memory limit: the limit is below what the step
    holds between steps (`unreachable`, not searched); else what stands at the plan's peak
    (simulated as the search priced it, with workspace model `simulated`) and the whole-op
    floor (of the root the root rewrites made, `rewritten_root`, where it is lower)."""
    if unreachable is not None:
        report["unreachable"] = unreachable.as_dict()
        report["search"]["stopped"] = "not searched: the limit is below the bytes held between steps"
    elif objective.mode == "memory" and not report["feasible"] and not best.compact:
        at_peak = simulate_timeline(best.program, best.order, cost, simulated)   # as the search priced it
        report["peak_standing"] = peak_standing(best.program, at_peak, best.tree).as_dict()
    if unreachable is None and objective.mode == "memory" and not report["feasible"]:
        whole: WholeOpFloor | None = whole_op_floor(g, int(objective.limit), device_name, workspace)
        if whole is not None and rewritten_root is not None:   # plans from the rewritten root: their floor
            root = rewritten_root
            rewritten = whole_op_floor(root.base.with_order(root.base_order), int(objective.limit), device_name,
                                       workspace, as_run="after the root rewrites")
            whole = rewritten if rewritten is None or rewritten.floor_bytes < whole.floor_bytes else whole
        if whole is not None:
            report["whole_op_floor"] = whole.as_dict()


def step_entry(g: Graph, accumulate: int) -> dict[str, Any]:
    """The report's description of the captured step: mode, optimizer, groups, clip, scaler,
    accumulation."""
    sig = g.signature
    spec = OptimizerSpec.from_dict(sig.optimizer)
    return {
        "mode": sig.mode, "optimizer": None if spec is None else spec.kind,
        "param_groups": 0 if spec is None else len(spec.groups), "max_grad_norm": sig.max_grad_norm,
        "grad_scaler": sig.grad_scaler, "accumulate": accumulate,
    }
