"""The device-memory curve of a timed schedule.

Device bytes only; host storages (outputs of peakcut.store) never count.
Caller-held storages count for the whole step (the baseline). Every other
storage is allocated when the first node that outputs a tensor in it starts and
freed when the last node that touches it (reads or outputs a tensor in it) ends;
storages of program outputs are never freed. A node's transient workspace is
live while it runs.

Events are ordered by (time, logical sequence): node i's start has sequence 2i
and its end 2i + 1, so at equal times a node's frees come before the next
node's allocations. With one stream this is exactly the step semantics of
peakcut.analysis.memory.simulate: the bytes after node i's start equal the
spine's timeline[i].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peakcut.analysis.memory import Hotspot
from peakcut.analysis.workspace import order_workspace
from peakcut.ir.graph import Graph
from peakcut.simulate.order import Schedule
from peakcut.simulate.streams import StreamTiming


@dataclass(frozen=True)
class StorageLife:
    """Device storages allocated by the step: where each is created and last touched.

    alloc[s]: position (in the order) of the node whose start allocates s;
    last[s]: position of the node whose end frees s, or None when s is a program
    output storage and lives to the end.
    """

    alloc: dict[int, int]
    last: dict[int, int | None]
    held: frozenset[int]


@dataclass(frozen=True)
class MemoryCurve:
    """Bytes live after each event, and where each node's events sit on the curve.

    times[0] / bytes[0] is the step's beginning (the baseline); point k >= 1 is
    after the k-th event. start_index[i] / end_index[i] are the points right after
    order[i] starts / ends.
    """

    times: np.ndarray          # float64
    bytes: np.ndarray          # int64
    baseline_bytes: int
    start_index: np.ndarray    # int64, aligned with the order
    end_index: np.ndarray      # int64, aligned with the order
    lives: StorageLife


def storage_lives(g: Graph, schedule: Schedule, timing: StreamTiming) -> StorageLife:
    """Allocating and freeing node of every device storage the step creates."""
    held = g.caller_held_storages()
    skip = held | g.host_storages()
    outs = g.output_storages()
    tensors = g.tensors
    end = timing.end.tolist()
    alloc: dict[int, int] = {}
    last: dict[int, int] = {}
    for i, (outputs, inputs) in enumerate(zip(schedule.outputs, schedule.inputs, strict=True)):
        e = end[i]
        for t in outputs:
            s = tensors[t].storage
            j = last.get(s)
            if j is None:
                if s not in skip:   # allocated here (a storage in `last` is in `alloc`)
                    alloc[s] = i
                    last[s] = i
            # the toucher that ends last frees it; at equal end times, the later in order
            elif e > end[j] or (e == end[j] and i > j):
                last[s] = i
        for t in inputs:
            s = tensors[t].storage
            j = last.get(s)
            if j is not None and (e > end[j] or (e == end[j] and i > j)):
                last[s] = i
    lasts: dict[int, int | None] = {s: (None if s in outs else j) for s, j in last.items()}
    return StorageLife(alloc=alloc, last=lasts, held=frozenset(held))


def workspace_bytes(g: Graph, schedule: Schedule, workspace: str | None) -> np.ndarray:
    """Transient workspace of each node in order (zeros when workspace is None)."""
    if workspace is None:
        return np.zeros(len(schedule.order), dtype=np.int64)
    return order_workspace(g, schedule.order, workspace)


def memory_curve(
    g: Graph, schedule: Schedule, timing: StreamTiming, workspace: str | None
) -> MemoryCurve:
    """Device bytes over time for `schedule` run with `timing`."""
    n = len(schedule.order)
    lives = storage_lives(g, schedule, timing)
    ws = workspace_bytes(g, schedule, workspace)
    on_start = ws.copy()
    on_end = -ws
    if lives.alloc:
        count = len(lives.alloc)
        sizes = np.fromiter((g.storages[s] for s in lives.alloc), dtype=np.int64, count=count)
        np.add.at(on_start, np.fromiter(lives.alloc.values(), dtype=np.int64, count=count), sizes)
        # storages that are never freed (program outputs) subtract nothing
        frees = (lives.last[s] for s in lives.alloc)
        last = np.fromiter((-1 if f is None else f for f in frees), dtype=np.int64, count=count)
        freed = last >= 0
        np.subtract.at(on_end, last[freed], sizes[freed])
    baseline = sum(g.storages[s] for s in lives.held)

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
        times=curve_times, bytes=curve, baseline_bytes=int(baseline),
        start_index=point[:n], end_index=point[n:], lives=lives,
    )


def live_storages(curve: MemoryCurve, k: int) -> list[int]:
    """Storages live at curve point k: caller-held ones, then those allocated and not yet freed."""
    live = list(curve.lives.held)
    start_index = curve.start_index.tolist()
    end_index = curve.end_index.tolist()
    last = curve.lives.last
    for s, a in curve.lives.alloc.items():
        f = last[s]
        if start_index[a] <= k and (f is None or end_index[f] > k):
            live.append(s)
    return live


def hotspots(g: Graph, schedule: Schedule, curve: MemoryCurve, k: int) -> tuple[Hotspot, ...]:
    """Storages live at curve point k with their bytes and origin, largest first."""
    owner: dict[int, int] = {}
    for t in g.inputs:
        owner.setdefault(g.tensors[t].storage, t)
    live = live_storages(curve, k)
    for s in live:
        a = curve.lives.alloc.get(s)
        if a is not None:
            owner[s] = next(t for t in schedule.outputs[a] if g.tensors[t].storage == s)
    spots = []
    for s in live:
        t = owner.get(s)
        meta = g.tensors[t] if t is not None else None
        a = curve.lives.alloc.get(s)
        producer = g.nodes[schedule.order[a]] if a is not None else None
        # Enum._value_ is what .value returns, without the descriptor's cost
        spots.append(Hotspot(
            storage=s, bytes=g.storages[s], tensor=meta.name if meta else str(s),
            module=producer.module if producer else "", role=meta.role._value_ if meta else "",
            phase=producer.phase._value_ if producer else "",
        ))
    spots.sort(key=lambda h: -h.bytes)
    return tuple(spots)
