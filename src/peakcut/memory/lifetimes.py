"""Storage lifetimes in event points: what an arena layout and an allocator replay read.

    life = step_lifetimes(g, order)                    # one stream: positions in the order
    life = step_lifetimes(g, order, NodeEvents(...))   # a timed order (streams overlap)

Time is counted in the points of the memory curve (peakcut.simulate's numbering): the node
at position i starts at point start[i] and ends at point end[i]; with one stream these are
2i + 1 and 2i + 2. Storage k is allocated at point alloc_at[k] (its first toucher starts)
and freed at point free_at[k] (its freeing node ends; `points` for a program output
storage, never freed), so it holds its bytes on the half-open range [alloc_at, free_at):
two storages whose ranges intersect must never share a byte. Which storages count and
which node allocates and frees each are peakcut.memory.liveness's rules (spans with one
stream, last_by_end when nodes overlap in time); this module only renumbers them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from peakcut.ir.graph import Graph, GraphError
from peakcut.memory.liveness import (
    BoolArray,
    FloatArray,
    Int64Array,
    last_by_end,
    spans,
    storage_touches,
)


@dataclass(frozen=True, eq=False)
class NodeEvents:
    """When each node of an order starts and ends on a timed memory curve: start[i] / end[i]
    are the curve points right after the node at position i starts / ends (a Timeline's
    start_index / end_index), end_time[i] its end in seconds (which toucher frees a storage
    when streams overlap). points: the number of curve points (2n + 1)."""

    start: Int64Array
    end: Int64Array
    end_time: FloatArray
    points: int


@dataclass(frozen=True, eq=False)
class Lifetimes:
    """The device storages a step allocates, with their bytes and event-point ranges.

    storages[k] (storage id), size[k] (bytes), alloc_at[k] / free_at[k] (module doc),
    alloc_node[k]: position of the node that allocates it. node_start[i] / node_end[i]:
    points of the node at position i. held: caller-held device storages (never allocated
    nor freed by the step), held_size their bytes and held_bytes the sum; points: the
    curve's length.
    """

    storages: list[int]
    size: Int64Array
    alloc_at: Int64Array
    free_at: Int64Array
    alloc_node: Int64Array
    node_start: Int64Array
    node_end: Int64Array
    held: tuple[int, ...]
    held_size: Int64Array
    held_bytes: int
    points: int

    def live_peak(self, keep: BoolArray | None = None) -> int:
        """Peak of the bytes live at once of the storages marked in `keep` (all: None)."""
        size = self.size if keep is None else np.where(keep, self.size, 0)
        return interval_peak(size, self.alloc_at, self.free_at, self.points)



def interval_peak(size: Int64Array, lo: Int64Array, hi: Int64Array, points: int) -> int:
    """Largest sum of sizes over storages live at one point: storage k on [lo[k], hi[k])."""
    if not len(size):
        return 0
    delta = np.zeros(points + 1, dtype=np.int64)
    np.add.at(delta, np.minimum(lo, points), size)
    np.subtract.at(delta, np.minimum(hi, points), size)
    return int(np.cumsum(delta).max())


def step_lifetimes(g: Graph, order: Sequence[int], events: NodeEvents | None = None) -> Lifetimes:
    """The lifetimes of the storages `order` allocates (module doc); `events`: the order's
    timed curve points, None for one stream. Raises GraphError when `events` does not
    have one entry per node of `order`."""
    order_t = tuple(order)
    n = len(order_t)
    touches = storage_touches(g, order_t)
    first, last = spans(touches)
    if events is None:
        start = 2 * np.arange(n, dtype=np.int64) + 1
        end = start + 1
        points = 2 * n + 1
        free_node = last
    else:
        if not len(events.start) == len(events.end) == len(events.end_time) == n:
            raise GraphError(f"events describe {len(events.start)} nodes, the order has {n}")
        start, end, points = events.start, events.end, events.points
        free_node = last_by_end(touches, events.end_time)
    alloc_at = start[first] if n else np.zeros(0, dtype=np.int64)
    free_at = np.full(len(touches.storages), points, dtype=np.int64)
    freed = ~touches.to_end & (free_node >= 0)
    free_at[freed] = end[free_node[freed]]
    held = tuple(sorted(touches.held))
    return Lifetimes(storages=list(touches.storages), size=touches.size, alloc_at=alloc_at, free_at=free_at,
                     alloc_node=first, node_start=start, node_end=end, held=held,
                     held_size=np.array([g.storages[s] for s in held], dtype=np.int64), held_bytes=int(touches.baseline), points=points)
