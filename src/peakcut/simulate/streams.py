"""Event timing: when each node starts and ends on the compute and copy streams.

One compute stream runs compute nodes in issue order. When the cost model
overlaps copies, swap-outs (peakcut.store) and writebacks of host-kept inputs
(peakcut.writeback) run on a device->host stream, and swap-ins and loads of host-kept
inputs (peakcut.load) on a host->device stream, as the generated code runs them
(rules/swap_code.py, rules/input_copy_code.py); they never block the compute
stream, only a consumer waiting for a copy's completion does. Otherwise every
node, copies included, runs on the compute stream in issue order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peakcut.cost.protocol import CostModel
from peakcut.ir.graph import Graph
from peakcut.ir.ops import COPY_DIRECTION
from peakcut.simulate.order import IssueOrder

COMPUTE = "compute"
D2H = "d2h"
H2D = "h2d"
STREAMS = (COMPUTE, D2H, H2D)


@dataclass(frozen=True)
class StreamTiming:
    """Start/end seconds and stream of each node, aligned with the issue order.

    exposed_copy_seconds: time copies cost the compute stream. With overlapped
    copies, the total time compute nodes waited for a copy (a load, or a store they
    depend on) to complete; with inline copies, the total time of the copies
    themselves, since the compute stream runs them.
    """

    start: np.ndarray          # float64, seconds
    end: np.ndarray            # float64, seconds
    stream: tuple[str, ...]
    exposed_copy_seconds: float

    @property
    def latency_seconds(self) -> float:
        """End of the last node on any stream (0 for an empty graph)."""
        return float(self.end.max()) if len(self.end) else 0.0


def node_stream(op: str, overlap_copies: bool) -> str:
    """The stream a node with op `op` runs on."""
    direction = COPY_DIRECTION.get(op) if overlap_copies else None
    if direction is None:
        return COMPUTE
    return D2H if direction == "d2h" else H2D


def node_seconds(g: Graph, order: tuple[int, ...], cost: CostModel) -> np.ndarray:
    """The cost model's latency of each node in order, checked to be finite and >= 0."""
    seconds = np.fromiter((cost.node_seconds(g, nid) for nid in order), dtype=np.float64,
                          count=len(order))
    bad = np.flatnonzero(~np.isfinite(seconds) | (seconds < 0))
    if len(bad):
        nid = order[int(bad[0])]
        node = g.nodes[nid]
        raise ValueError(
            f"cost model {cost.name!r} gives node {node.name or nid} ({node.op}) "
            f"a latency of {seconds[bad[0]]} s; expected a finite number >= 0"
        )
    return seconds


def time_streams(g: Graph, issued: IssueOrder, cost: CostModel) -> StreamTiming:
    """Start and end of every node when issued in `issued.order`."""
    overlap = bool(cost.overlap_copies)
    n = len(issued.order)
    times = node_seconds(g, issued.order, cost)
    ops = [g.nodes[nid].op for nid in issued.order]
    copies = np.fromiter((op in COPY_DIRECTION for op in ops), dtype=bool, count=n)
    if not (overlap and copies.any()):
        # one stream: each node starts when the one before ends (cumsum adds in order, as the
        # loop below would); copies are exposed for their whole time
        ends = np.cumsum(np.concatenate(([0.0], times)))
        exposed = 0.0
        for s in times[copies].tolist():
            exposed += s
        return StreamTiming(start=ends[:-1].copy(), end=ends[1:].copy(), stream=(COMPUTE,) * n,
                            exposed_copy_seconds=float(exposed))
    seconds = times.tolist()
    start = [0.0] * n
    end = [0.0] * n
    streams: list[str] = []
    on_copy_stream = [False] * n
    stream_free = dict.fromkeys(STREAMS, 0.0)
    exposed = 0.0
    # only waits on a copy stream, and the waits of copies, can delay a node: the others are
    # for nodes that ran earlier on the same stream
    waits = issued.waits_of(copies)
    no_waits: list[int] = []
    for i, op in enumerate(ops):
        preds = waits.get(i, no_waits)
        stream = node_stream(op, True) if copies[i] else COMPUTE     # (here copies overlap)
        compute_free = stream_free[COMPUTE]
        if stream == COMPUTE:
            # compute predecessors ran earlier on this stream: only copies can hold it back
            begin = compute_free
            for p in preds:
                if on_copy_stream[p] and end[p] > begin:
                    begin = end[p]
            exposed += begin - compute_free
        else:
            # issued once the compute node before it in order has finished
            begin = max(stream_free[stream], compute_free)
            for p in preds:
                begin = max(begin, end[p])
            on_copy_stream[i] = True
        start[i] = begin
        end[i] = begin + seconds[i]
        stream_free[stream] = end[i]
        streams.append(stream)
    return StreamTiming(
        start=np.asarray(start, dtype=np.float64),
        end=np.asarray(end, dtype=np.float64),
        stream=tuple(streams),
        exposed_copy_seconds=float(exposed),
    )
