"""Memory simulation of a graph run in a given order, one node at a time.

    profile = simulate(g, order)       # order: node ids (default: capture order)
    profile.peak_bytes, profile.timeline, profile.hotspots

Storages are live as peakcut.memory.liveness says (the same rules as the generated
program's); while a node runs, its inputs, its new outputs and its transient workspace
(peakcut.memory.workspace) are all live: Python frees an argument only after the call
returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from peakcut.ir.graph import Graph, GraphError
from peakcut.memory.hotspots import PeakStorage, hotspots
from peakcut.memory.liveness import Int64Array, live_bytes, spans, storage_touches
from peakcut.memory.workspace import WorkspaceSpec, order_workspace


@dataclass(frozen=True)
class MemoryProfile:
    """Bytes live during each step of `order`, the peak, and what is live there."""

    order: tuple[int, ...]
    timeline: Int64Array            # bytes live while order[i] runs
    peak_bytes: int
    peak_index: int                 # position in order of the (first) peak
    baseline_bytes: int             # caller-held bytes (live all step)
    storage_lifetime: dict[int, tuple[int, int]]  # storage -> (alloc index, free index), -1/len for held
    workspace: Int64Array           # transient workspace bytes per step
    hotspots: tuple[PeakStorage, ...] = field(default=())

    @property
    def peak_node(self) -> int:
        return self.order[self.peak_index]

    def hotspots_by_module(self) -> list[tuple[str, int]]:
        """Bytes live at the peak grouped by producing module, largest first."""
        acc: dict[str, int] = {}
        for h in self.hotspots:
            key = h.module or f"<{h.phase or h.role}>"
            acc[key] = acc.get(key, 0) + h.bytes
        return sorted(acc.items(), key=lambda kv: -kv[1])


def simulate(g: Graph, order: Sequence[int] | None = None, workspace: WorkspaceSpec = "auto") -> MemoryProfile:
    """Simulate `order` (a topological order of g's node ids; default: capture order).

    workspace: the transient-workspace model ("cpu", a WorkspaceModel), or None to ignore
    workspace. Raises GraphError when `order` does not have one entry per node.
    """
    order_t = tuple(g.order if order is None else order)
    if len(order_t) != len(g.nodes):
        raise GraphError(f"order has {len(order_t)} nodes, graph has {len(g.nodes)}")
    n = len(order_t)
    touches = storage_touches(g, order_t)
    first, last = spans(touches)
    ws = order_workspace(g, order_t, workspace)
    timeline = live_bytes(touches.size, first, last, n) + touches.baseline + ws
    peak_index = int(np.argmax(timeline)) if n else 0
    peak = int(timeline[peak_index]) if n else touches.baseline

    allocs = first.tolist()
    frees = last.tolist()
    lifetime = dict(zip(touches.storages, zip(allocs, frees, strict=True), strict=True))
    lifetime.update({s: (-1, n) for s in touches.held})
    live = np.flatnonzero((first <= peak_index) & (peak_index <= last)).tolist()
    allocated = {touches.storages[k]: (touches.owner[k], order_t[allocs[k]]) for k in live}
    hot = hotspots(g, [*allocated, *touches.held], allocated)
    return MemoryProfile(order_t, timeline, peak, peak_index, touches.baseline, lifetime, ws, hot)


def tensor_lifetimes(g: Graph, order: Sequence[int]) -> dict[int, tuple[int, int]]:
    """Tensor id -> (index of producer, index of last reader); inputs start at -1, program
    outputs end at len(order)."""
    pos = {nid: i for i, nid in enumerate(order)}
    end = len(order)
    life: dict[int, tuple[int, int]] = {t: (-1, -1) for t in g.inputs}
    for nid in order:
        for t in g.nodes[nid].output_tuple:
            life[t] = (pos[nid], pos[nid])
    for nid in order:
        for t in g.nodes[nid].input_tuple:
            start, stop = life[t]
            life[t] = (start, max(stop, pos[nid]))
    for t in g.outputs:
        life[t] = (life[t][0], end)
    return life
