"""The device-memory curve of a timed issue order.

Storages are live as peakcut.memory.liveness says, with time instead of steps: a storage
is allocated when the first node that touches it starts and freed when the last node that
touches it ends (the one that ends last when streams overlap; at equal end times the later
in order); storages of program outputs are never freed, caller-held ones are the baseline,
host storages never count. A node's transient workspace is live while it runs.

Events are ordered by (time, logical sequence): node i's start has sequence 2i and its end
2i + 1, so at equal times a node's frees come before the next node's allocations. With one
stream this is exactly the step simulation (peakcut.memory.simulate): the bytes after node
i's start equal its timeline[i].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peakcut.ir.graph import Graph
from peakcut.memory.hotspots import PeakStorage, hotspots
from peakcut.memory.liveness import (
    FloatArray,
    Int64Array,
    StorageTouches,
    last_by_end,
    spans,
    storage_touches,
)
from peakcut.memory.workspace import WorkspaceSpec, order_workspace
from peakcut.simulate.order import IssueOrder
from peakcut.simulate.streams import StreamTiming


@dataclass(frozen=True, eq=False)
class MemoryCurve:
    """Bytes live after each event, and where each node's events sit on the curve.

    times[0] / bytes[0] is the step's beginning (the baseline); point k >= 1 is after the
    k-th event. start_index[i] / end_index[i] are the points right after order[i] starts /
    ends. Storage k of `touches` is allocated when node alloc[k] starts and freed when node
    free[k] ends (-1: a program output storage, never freed); nodes are positions in the order.
    """

    times: FloatArray
    bytes: Int64Array
    baseline_bytes: int
    start_index: Int64Array
    end_index: Int64Array
    touches: StorageTouches
    alloc: Int64Array
    free: Int64Array


def memory_curve(g: Graph, issued: IssueOrder, timing: StreamTiming, workspace: WorkspaceSpec) -> MemoryCurve:
    """Device bytes over time for `issued` run with `timing`."""
    n = len(issued.order)
    touches = storage_touches(g, issued.order)
    end = timing.end
    if n and bool((end[1:] >= end[:-1]).all()):
        # ends never go back in time (one stream): the last toucher ends last
        alloc, free = spans(touches)
        free[touches.to_end] = -1
    else:
        alloc, _ = spans(touches)
        free = last_by_end(touches, end)
    ws = order_workspace(g, issued.order, workspace)
    on_start = ws.copy()
    on_end = -ws
    size = touches.size
    np.add.at(on_start, alloc, size)
    freed = free >= 0
    np.subtract.at(on_end, free[freed], size[freed])
    baseline = touches.baseline

    times = np.concatenate([timing.start, timing.end])
    position = np.arange(n, dtype=np.int64)
    seq = np.concatenate([2 * position, 2 * position + 1])
    perm = np.lexsort((seq, times))
    deltas = np.concatenate([on_start, on_end])[perm]
    curve = np.empty(2 * n + 1, dtype=np.int64)
    curve[0] = baseline
    np.cumsum(deltas, out=curve[1:])
    curve[1:] += baseline
    curve_times = np.empty(2 * n + 1, dtype=np.float64)
    curve_times[0] = 0.0
    curve_times[1:] = times[perm]
    point = np.empty(2 * n, dtype=np.int64)
    point[perm] = np.arange(1, 2 * n + 1, dtype=np.int64)
    return MemoryCurve(
        times=curve_times, bytes=curve, baseline_bytes=int(baseline), start_index=point[:n],
        end_index=point[n:], touches=touches, alloc=alloc, free=free,
    )


def live_allocated(curve: MemoryCurve, k: int) -> list[int]:
    """Indices (in curve.touches) of the storages the step allocated that are live at curve
    point k: allocated by then and not yet freed, in allocation order."""
    allocated = curve.start_index[curve.alloc] <= k
    freed = curve.free >= 0
    gone = np.zeros_like(freed)
    gone[freed] = curve.end_index[curve.free[freed]] <= k
    return np.flatnonzero(allocated & ~gone).tolist()


def curve_hotspots(g: Graph, issued: IssueOrder, curve: MemoryCurve, k: int) -> tuple[PeakStorage, ...]:
    """Storages live at curve point k with their bytes and origin, largest first: caller-held
    ones, then those allocated and not yet freed."""
    touches = curve.touches
    alloc = curve.alloc.tolist()
    order = issued.order
    allocated = {touches.storages[j]: (touches.owner[j], order[alloc[j]]) for j in live_allocated(curve, k)}
    return hotspots(g, [*frozenset(touches.held), *allocated], allocated)
