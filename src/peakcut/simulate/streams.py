"""Event timing: when each node starts and ends on the compute, copy and host streams.

One compute stream runs compute nodes in issue order. When the cost model
overlaps copies, swap-outs (peakcut.store) and writebacks of host-kept inputs
(peakcut.writeback) run on a device->host stream, and swap-ins, loads of host-kept
inputs (peakcut.load) and uploads (peakcut.upload) on a host->device stream, as the
generated code runs them (codegen/swap_code.py, codegen/input_copy_code.py,
codegen/host_update_code.py); nodes that run on the host (NodeTags.on_host: a parameter's
update moved there) run in issue order on a host stream, as the generated code's host
worker thread runs them. None of them blocks the compute stream, only a consumer waiting
for one's completion does. A copy starts once the compute node issued before it has
finished and what it depends on is done; a host op once what it depends on is done (the
worker thread takes its queue while the Python thread issues kernels far ahead of the
device, so a host op placed after the backward in the order still starts with the first
gradient it reads). Otherwise (a CPU, where the host is the device) every node,
copies and host nodes included, runs on the compute stream in issue order.

Collectives (ir.collectives: a gradient bucket's all-reduce, a buffer's broadcast) run on a
communication stream when copies overlap: started in issue order once the compute node
before them has finished and what they read is done, like a copy; the wait node after one is
a compute node that waits for its end.

On an asynchronous device (a GPU: the cost model prices a node's issue apart, CostModel
issue_seconds) one host thread issues the nodes in order, each taking its issue seconds, and
a node starts on its stream no earlier than it has been issued: the device runs ahead of
nothing, and the thread runs ahead of the device as far as the device is slower. Nodes on
the host are issued by their worker thread, not by this one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peakcut.cost.protocol import CostModel, issue_seconds
from peakcut.ir.collectives import STARTS
from peakcut.ir.graph import Graph
from peakcut.ir.ops import COPY_DIRECTION
from peakcut.simulate.order import IssueOrder

COMPUTE = "compute"
D2H = "d2h"
H2D = "h2d"
HOST = "host"
COMM = "comm"
STREAMS = (COMPUTE, D2H, H2D, HOST, COMM)


@dataclass(frozen=True)
class StreamTiming:
    """Start/end seconds and stream of each node, aligned with the issue order.

    exposed_copy_seconds: time copies cost the compute stream. With overlapped
    copies, the total time compute nodes waited for a copy (a load, or a store they
    depend on) or a node on the host to complete; with inline copies, the total time
    of the copies themselves, since the compute stream runs them.
    """

    start: np.ndarray          # float64, seconds
    end: np.ndarray            # float64, seconds
    stream: tuple[str, ...]
    exposed_copy_seconds: float

    @property
    def latency_seconds(self) -> float:
        """End of the last node on any stream (0 for an empty graph)."""
        return float(self.end.max()) if len(self.end) else 0.0


def node_stream(op: str, overlap_copies: bool, on_host: bool = False) -> str:
    """The stream a node with op `op` runs on (on_host: a node that runs on the host)."""
    if not overlap_copies:
        return COMPUTE
    if on_host:
        return HOST
    if op in STARTS:
        return COMM
    direction = COPY_DIRECTION.get(op)
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
    nodes = [g.nodes[nid] for nid in issued.order]
    ops = [node.op for node in nodes]
    copies = np.fromiter((op in COPY_DIRECTION for op in ops), dtype=bool, count=n)
    on_host = np.fromiter((node.tags.on_host for node in nodes), dtype=bool, count=n)
    collectives = np.fromiter((op in STARTS for op in ops), dtype=bool, count=n)
    off_compute = copies | on_host | collectives
    issue = np.fromiter((issue_seconds(cost, g, nid) for nid in issued.order), dtype=np.float64, count=n)
    issue[on_host] = 0.0
    issued_at = np.cumsum(issue)          # when the issuing thread is done with each node
    if not (overlap and off_compute.any()) and not issue.any():
        # one stream, nothing issued ahead: each node starts when the one before ends (cumsum
        # adds in order, as the loop below would); copies are exposed for their whole time
        exposed = 0.0
        for s in times[copies].tolist():
            exposed += s
        ends = np.cumsum(np.concatenate(([0.0], times)))
        return StreamTiming(start=ends[:-1].copy(), end=ends[1:].copy(), stream=(COMPUTE,) * n,
                            exposed_copy_seconds=float(exposed))
    seconds = times.tolist()
    issued_list = issued_at.tolist()
    start = [0.0] * n
    end = [0.0] * n
    streams: list[str] = []
    beside_compute = [False] * n
    stream_free = dict.fromkeys(STREAMS, 0.0)
    exposed = 0.0
    # only waits on a copy or host stream, and the waits of copies and host nodes, can delay a
    # node: the others are for nodes that ran earlier on the same stream
    waits = issued.waits_of(off_compute)
    no_waits: list[int] = []
    host = on_host.tolist()
    for i, op in enumerate(ops):
        preds = waits.get(i, no_waits)
        stream = node_stream(op, True, host[i]) if off_compute[i] else COMPUTE   # (copies overlap)
        compute_free = stream_free[COMPUTE]
        if stream == COMPUTE:
            # compute predecessors ran earlier on this stream: only copies and host nodes can hold
            # it back (and its issue, on an asynchronous device)
            ready = compute_free if compute_free >= issued_list[i] else issued_list[i]
            begin = ready
            for p in preds:
                if beside_compute[p] and end[p] > begin:
                    begin = end[p]
            exposed += begin - ready
        else:
            # a copy is issued once the compute node before it in order has finished; a host
            # op as soon as what it reads is there (the host worker takes its queue while the
            # Python thread issues kernels ahead of the device)
            begin = stream_free[stream] if host[i] else max(stream_free[stream], compute_free, issued_list[i])
            for p in preds:
                begin = max(begin, end[p])
            beside_compute[i] = True
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
