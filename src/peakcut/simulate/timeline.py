"""The Timeline of one training step: latency, per-node times, memory over time, peak.

Entry point: simulate_timeline(g, order, cost). Timing rules live in
peakcut.simulate.streams, the memory curve in peakcut.simulate.memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from peakcut.cost.protocol import CostModel
from peakcut.ir.collectives import overlapped_order
from peakcut.ir.graph import Graph
from peakcut.memory import PeakStorage
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.simulate.memory import curve_hotspots, memory_curve
from peakcut.simulate.order import issue_order
from peakcut.simulate.streams import COMPUTE, time_streams


@dataclass(frozen=True, eq=False)
class Timeline:
    """One simulated step. Arrays named per node are aligned with `order`.

    times / bytes: the memory curve; point 0 is the step's beginning (the
    caller-held baseline), point k the device bytes right after the k-th event
    (a node starting or ending). peak_node is the node running on the compute
    stream at the peak, or None when the compute stream is idle there.
    exposed_copy_seconds: see peakcut.simulate.streams.StreamTiming.
    """

    order: tuple[int, ...]
    cost_name: str
    latency_seconds: float
    start: np.ndarray              # float64 seconds, per node
    end: np.ndarray                # float64 seconds, per node
    stream: tuple[str, ...]        # "compute" | "d2h" | "h2d", per node
    times: np.ndarray              # float64 seconds, per curve point
    bytes: np.ndarray              # int64 device bytes, per curve point
    peak_bytes: int
    peak_time: float
    peak_node: int | None
    baseline_bytes: int
    hotspots: tuple[PeakStorage, ...]
    exposed_copy_seconds: float
    position: dict[int, int] = field(repr=False)
    start_index: np.ndarray = field(repr=False)   # curve point right after each node starts
    end_index: np.ndarray = field(repr=False)     # curve point right after each node ends

    def _pos(self, node_id: int) -> int:
        try:
            return self.position[node_id]
        except KeyError:
            raise KeyError(f"node {node_id} is not in this timeline") from None

    def start_of(self, node_id: int) -> float:
        """Seconds from the step's beginning to when the node starts."""
        return float(self.start[self._pos(node_id)])

    def end_of(self, node_id: int) -> float:
        """Seconds from the step's beginning to when the node completes."""
        return float(self.end[self._pos(node_id)])

    def stream_of(self, node_id: int) -> str:
        return self.stream[self._pos(node_id)]

    def memory_at(self, node_id: int) -> int:
        """Device bytes while the node runs: after its allocations, with its workspace."""
        return int(self.bytes[self.start_index[self._pos(node_id)]])

    def memory_before(self, node_id: int) -> int:
        """Device bytes right before the node starts (before its allocations)."""
        return int(self.bytes[self.start_index[self._pos(node_id)] - 1])

    def node_times(self) -> dict[int, tuple[float, float, str]]:
        """Node id -> (start, end, stream)."""
        return {
            nid: (float(s), float(e), st)
            for nid, s, e, st in zip(self.order, self.start, self.end, self.stream, strict=True)
        }


def simulate_timeline(
    g: Graph, order: Sequence[int] | None, cost: CostModel, workspace: WorkspaceSpec = "auto"
) -> Timeline:
    """Simulate the step issued in `order` (None: capture order) under `cost`.

    workspace: the transient-workspace model (peakcut.memory.workspace: "auto", the model of
    the graph's device, by default; a spec or a model), or None to ignore workspace. Raises
    peakcut.ir.graph.GraphError when `order` is not a topological order of g's nodes.
    """
    issued = issue_order(g, overlapped_order(g, g.order if order is None else order))
    timing = time_streams(g, issued, cost)
    curve = memory_curve(g, issued, timing, workspace)
    k = int(np.argmax(curve.bytes))
    on_compute = np.fromiter((st == COMPUTE for st in timing.stream), dtype=bool,
                             count=len(timing.stream))
    running = np.flatnonzero(on_compute & (curve.start_index <= k) & (k < curve.end_index))
    return Timeline(
        order=issued.order,
        cost_name=cost.name,
        latency_seconds=timing.latency_seconds,
        start=timing.start,
        end=timing.end,
        stream=timing.stream,
        times=curve.times,
        bytes=curve.bytes,
        peak_bytes=int(curve.bytes[k]),
        peak_time=float(curve.times[k]),
        peak_node=issued.order[int(running[0])] if len(running) else None,
        baseline_bytes=curve.baseline_bytes,
        hotspots=curve_hotspots(g, issued, curve, k),
        exposed_copy_seconds=timing.exposed_copy_seconds,
        position=issued.position,
        start_index=curve.start_index,
        end_index=curve.end_index,
    )
