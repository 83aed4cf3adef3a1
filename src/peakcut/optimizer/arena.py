"""The report's arena and reserved-bytes figures of a plan: what a device must hold beyond live bytes.

    report.update(arena_entries(state.program, state.order, cost, workspace, time_limit=...))

The plan's order is timed on the cost model's streams where nodes run beside the compute
stream (peakcut.simulate: copies, collectives, host nodes), and its storages are laid out in
one arena (peakcut.memory.layout): `arena_bytes` (the caller's storages and the ops'
transient workspace are not in it), `fragmentation` (arena / the peak of the arena storages'
live bytes). `predicted_reserved_bytes` is what the device's allocator would reserve for the
plan's allocation sequence without the arena (peakcut.memory.allocations: PyTorch's CUDA
caching allocator modelled for a GPU profile, the CPU allocator for a CPU one), caller's
storages and workspace included: the figure to compare with max_memory_reserved.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from peakcut.cost.protocol import CostModel
from peakcut.ir.collectives import STARTS
from peakcut.ir.graph import Graph
from peakcut.ir.ops import COPY_DIRECTION
from peakcut.memory.allocations import predict_reserved
from peakcut.memory.layout import plan_layout
from peakcut.memory.lifetimes import NodeEvents
from peakcut.memory.workspace import WorkspaceSpec, order_workspace
from peakcut.optimizer.shares import LAYOUT_SHARE
from peakcut.simulate import simulate_timeline

METHOD = "simulated (layout of the plan's order)"
LAYOUT_MAX_S = 10.0      # the layout's seconds under an unbounded time budget


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
                  time_limit: float) -> dict[str, Any]:
    """The report's entries for the plan (g, order) (module doc): arena_bytes, fragmentation,
    predicted_reserved_bytes, and `layout` with the details and their methods; the layout's
    greedy orders after the first and its exact model stop at `time_limit` seconds."""
    t0 = time.perf_counter()
    events = None
    if not one_stream(g, order, cost):
        timed = simulate_timeline(g, order, cost, workspace)
        events = NodeEvents(start=timed.start_index, end=timed.end_index, end_time=timed.end,
                            points=len(timed.bytes))
    left = max(0.0, time_limit - (time.perf_counter() - t0))
    lay = plan_layout(g, order, events=events, time_limit=left)
    device = allocator_device(cost)
    reserved = predict_reserved(lay.lifetimes, order_workspace(g, order, workspace), device=device)
    details = dict(lay.as_dict(), method=f"{METHOD}: {lay.method}",
                   reserved_method=f"simulated (the plan's order): {reserved.method}",
                   predicted_allocated_bytes=reserved.peak_allocated,
                   allocator=device, seconds=round(time.perf_counter() - t0, 4))
    return {"arena_bytes": lay.arena_bytes, "fragmentation": lay.fragmentation,
            "predicted_reserved_bytes": reserved.peak_reserved, "layout": details}
