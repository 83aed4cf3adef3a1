"""The report's arena and reserved-bytes figures of a plan: what a device must hold beyond live bytes.

    report.update(arena_entries(state.program, state.order, cost, workspace, time_limit=...))

The plan's order is timed on the cost model's streams where nodes run beside the compute
stream (peakcut.simulate: copies, collectives, host nodes), and its storages are laid out in
one arena (peakcut.memory.layout): `arena_bytes` (the caller's storages and the ops'
transient workspace are not in it), `fragmentation` (arena / the peak of the arena storages'
live bytes). `predicted_reserved_bytes` is what the device's allocator would reserve for the
plan's allocation sequence without the arena (peakcut.memory.allocations: PyTorch's CUDA
caching allocator modelled for a GPU profile, glibc's malloc as the process configures it
for a CPU one: keeping freed memory where optimize set it up to measure, else its defaults),
caller's storages and workspace included: the figure to compare with max_memory_reserved (on
a CPU, the resident bytes); `layout["reserved_method"]` names the model.

With the arena enforced (optimize(..., arena=True)), the program places what it can in the
arena (codegen.arena_plan) and a memory limit bounds the caller's storages + the arena + the
unplanned remainder's peak: the search plans to the limit less the root's overhead of that
figure over its live peak (arena_margin), and arena_choice keeps the best plan whose figure
meets the limit. optimize's default (arena=None) is arena_by_default: an arena for a step on
a CPU whose transient bytes reach ARENA_MIN_BYTES.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from peakcut.codegen.arena_plan import ArenaPlan, plan_arena
from peakcut.cost.protocol import CostModel
from peakcut.ir.collectives import STARTS, overlapped_order
from peakcut.ir.graph import Graph
from peakcut.ir.ops import COPY_DIRECTION
from peakcut.memory.allocations import predict_reserved
from peakcut.memory.layout import plan_layout
from peakcut.memory.lifetimes import NodeEvents
from peakcut.memory.workspace import WorkspaceSpec, order_workspace
from peakcut.optimizer.derive import DeriveError, Deriver
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.search import SearchResult
from peakcut.optimizer.shares import KEPT_BESTS, LAYOUT_SHARE
from peakcut.optimizer.state import State
from peakcut.simulate import Timeline, simulate_timeline

METHOD = "simulated (layout of the plan's order)"
LAYOUT_MAX_S = 10.0      # the layout's seconds under an unbounded time budget

# optimize's default arena: below this many transient bytes a step's heap splits by a few MiB at
# most, while placing a result costs its view and out call (about 10 us each on a CPU)
ARENA_MIN_BYTES = 64 * 2**20


def arena_by_default(g: Graph, eager: Timeline) -> bool:
    """optimize's arena=None: an arena for a step on a CPU whose transient bytes (eager's live
    peak less what the caller holds between steps) reach ARENA_MIN_BYTES. There glibc's heap
    splits around the step's tensors without one (docs/memory_layout.md); on a GPU the caching
    allocator keeps its segments."""
    return g.device.startswith("cpu") and eager.peak_bytes - eager.baseline_bytes >= ARENA_MIN_BYTES


def arena_setting(arena: bool | None, distributed: bool, accumulate: int) -> bool | None:
    """optimize's `arena` argument, checked: None (arena_by_default decides for each captured
    step) stays None only for a single-process step without accumulation, whose micro-batch
    step would hold a second arena; elsewhere it is False."""
    if arena is not None and not isinstance(arena, bool):
        raise ValueError(f"arena={arena!r}: expected True, False or None (optimizer.arena.arena_by_default)")
    return False if arena is None and (distributed or accumulate > 1) else arena


def layout_seconds(time_budget: float) -> float:
    """The seconds the layout may take of an optimize call's `time_budget` (LAYOUT_SHARE of
    it, at most LAYOUT_MAX_S); its first greedy order always runs."""
    return min(LAYOUT_MAX_S, LAYOUT_SHARE * time_budget) if time_budget > 0 else 0.0


def one_stream(g: Graph, order: Sequence[int], cost: CostModel) -> bool:
    """Every node of `order` runs on the compute stream, in order (peakcut.simulate.streams:
    no copy, collective or host node beside it), so lifetimes in positions are the timed ones."""
    if not cost.overlap_copies:
        return True
    nodes = g.nodes
    return not any(node.op in COPY_DIRECTION or node.op in STARTS or node.tags.on_host
                   for node in map(nodes.__getitem__, order))


def allocator_device(cost: CostModel) -> str:
    """The allocator a plan priced by `cost` runs on: "cpu" for the CPU profile and a model
    measured on the CPU, else "cuda"."""
    name = cost.name.removeprefix("analytic:")
    return "cpu" if name == "cpu" or name.startswith("measured:cpu") else "cuda"


def arena_entries(g: Graph, order: Sequence[int], cost: CostModel, workspace: WorkspaceSpec,
                  time_limit: float, host_keeps_freed: bool = False) -> dict[str, Any]:
    """The report's entries for the plan (g, order) (module doc): arena_bytes, fragmentation,
    predicted_reserved_bytes, and `layout` with the details and their methods; the layout's
    greedy orders after the first and its exact model stop at `time_limit` seconds.
    host_keeps_freed: on a CPU, the plan runs where glibc keeps freed memory
    (runtime.host_allocator.keep_freed_host_memory), else under glibc's defaults."""
    t0 = time.perf_counter()
    events = None
    if not one_stream(g, order, cost):
        timed = simulate_timeline(g, order, cost, workspace)
        events = NodeEvents(start=timed.start_index, end=timed.end_index, end_time=timed.end,
                            points=len(timed.bytes))
    left = max(0.0, time_limit - (time.perf_counter() - t0))
    lay = plan_layout(g, order, events=events, time_limit=left)
    device = allocator_device(cost)
    reserved = predict_reserved(lay.lifetimes, order_workspace(g, order, workspace), device=device,
                                host_keeps_freed=host_keeps_freed)
    details = dict(lay.as_dict(), method=f"{METHOD}: {lay.method}",
                   reserved_method=f"simulated (the plan's order): {reserved.method}",
                   predicted_allocated_bytes=reserved.peak_allocated,
                   allocator=device, seconds=round(time.perf_counter() - t0, 4))
    return {"arena_bytes": lay.arena_bytes, "fragmentation": lay.fragmentation,
            "predicted_reserved_bytes": reserved.peak_reserved, "layout": details}


def state_arena(state: State, workspace: WorkspaceSpec, time_limit: float,
                probes: dict[tuple[Any, ...], str | None] | None = None) -> ArenaPlan:
    """The arena plan of a state's program as its Step builds it (codegen.arena_plan: the
    order with collectives overlapped, the out overloads probed on the graph's device; probes:
    the verdicts of earlier probes, used and added to), laid out by the greedy orders only (the
    exact model's seconds would go to every plan arena_choice looks at)."""
    g = state.program
    return plan_arena(g, overlapped_order(g, list(state.order)), workspace=workspace, time_limit=time_limit,
                      probes=probes, exact=False)


def arena_margin(planned: Objective, root: State, workspace: WorkspaceSpec, time_limit: float,
                 probes: dict[tuple[Any, ...], str | None] | None = None) -> Objective:
    """Under a memory limit with the arena, the limit the search plans to: the user's less what
    the root's arena and unplanned remainder need beyond its live peak (an estimate of every
    plan's; arena_choice checks the plans themselves)."""
    if planned.mode != "memory" or not math.isfinite(planned.limit):
        return planned
    over = max(0, state_arena(root, workspace, time_limit, probes).needed_bytes - root.peak_bytes)
    return replace(planned, limit=max(0.0, planned.limit - over))


def arena_choice(result: SearchResult, objective: Objective, deriver: Deriver, candidates: Sequence[State],
                 time_limit: float, probes: dict[tuple[Any, ...], str | None] | None = None
                 ) -> tuple[SearchResult, ArenaPlan]:
    """The plan kept with the arena, and its arena plan. Under a memory limit: the first of the
    search's best, its KEPT_BESTS earlier bests (newest first) and `candidates` (the roots) whose live
    peak meets the limit and whose held + arena + unplanned bytes do too; where none does, the
    one that needs the fewest bytes. Under a latency limit: the search's best."""
    deadline = time.perf_counter() + time_limit
    best = deriver.exact(result.best)
    if objective.mode != "memory":
        return replace(result, best=best), state_arena(best, deriver.workspace, time_limit, probes)
    seen: set[int] = set()
    least: tuple[State, ArenaPlan] | None = None
    for state in (result.best, *reversed(result.bests[-KEPT_BESTS:]), *candidates):
        if id(state) in seen or not objective.feasible(state.peak_bytes, state.latency_s):
            continue
        seen.add(id(state))
        try:
            exact = deriver.exact(state)
        except DeriveError:
            continue
        ap = state_arena(exact, deriver.workspace, max(0.0, deadline - time.perf_counter()), probes)
        if ap.needed_bytes <= objective.limit:
            return replace(result, best=exact), ap
        if least is None or ap.needed_bytes < least[1].needed_bytes:
            least = (exact, ap)
        if time.perf_counter() > deadline:
            break
    if least is None:
        return replace(result, best=best), state_arena(best, deriver.workspace, 0.0, probes)
    return replace(result, best=least[0]), least[1]
