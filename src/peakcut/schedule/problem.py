"""The scheduling problem in compact integer form, and the memory of an order.

Nodes are numbered 0..n-1 in the graph's capture order. Memory follows the step
simulation's rules exactly (peakcut.memory.liveness: a storage is live from the first
node that touches it to the last, program output storages to the end, caller-held ones
all step, host ones never), with each node's workspace live while it runs.

`Problem.peak(order)` is a vectorised evaluation (numpy), cheap enough to be
called thousands of times on graphs of ~10k nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from peakcut.ir.graph import Graph, GraphError
from peakcut.memory.liveness import Int64Array, live_bytes, spans, storage_touches
from peakcut.memory.workspace import WorkspaceSpec, order_workspace


@dataclass(frozen=True)
class OrderMemory:
    """Bytes live while each position of an order runs."""

    timeline: Int64Array   # len n
    peak_bytes: int
    peak_index: int


Order = Sequence[int] | Int64Array
"""An order of node indices: a list, or an int64 array (local search builds its candidates as arrays)."""


class Problem:
    """A graph reduced to what ordering needs: dependencies, storages, sizes, workspaces."""

    def __init__(self, g: Graph, workspace: WorkspaceSpec = "auto") -> None:
        self.graph = g
        self.ids: list[int] = list(g.order)
        self.index: dict[int, int] = {nid: i for i, nid in enumerate(self.ids)}
        n = len(self.ids)
        self.n = n
        self.preds: list[tuple[int, ...]] = []
        for nid in self.ids:
            self.preds.append(tuple(sorted(self.index[p] for p in g.predecessors(nid))))
        succs: list[list[int]] = [[] for _ in range(n)]
        for v, ps in enumerate(self.preds):
            if ps and ps[-1] >= v:
                raise GraphError(f"graph order runs node {self.ids[v]} before its predecessor "
                                 f"{self.ids[ps[-1]]}; Problem needs a topological graph order")
            for p in ps:
                succs[p].append(v)
        self.succs: list[tuple[int, ...]] = [tuple(s) for s in succs]

        self.storage_touches = storage_touches(g, self.ids)
        touched = self.storage_touches
        self.storage_ids: list[int] = touched.storages
        self.size = touched.size
        self.to_end = touched.to_end
        touches: list[set[int]] = [set() for _ in self.storage_ids]
        for k, v in zip(touched.touch_storage.tolist(), touched.touch_node.tolist(), strict=True):
            touches[k].add(v)
        self.touches: list[tuple[int, ...]] = [tuple(sorted(t)) for t in touches]
        node_storages: list[list[int]] = [[] for _ in range(n)]
        for k, ts in enumerate(self.touches):
            for v in ts:
                node_storages[v].append(k)
        self.node_storages: list[tuple[int, ...]] = [tuple(x) for x in node_storages]
        self.baseline = touched.baseline
        self.workspace = order_workspace(g, self.ids, workspace)

    # ------------------------------------------------------------ orders
    def to_positions(self, order: Order) -> Int64Array:
        """Position of each node (by index) in an order given as node indices."""
        pos = np.empty(self.n, dtype=np.int64)
        pos[np.asarray(order, dtype=np.int64)] = np.arange(self.n, dtype=np.int64)
        return pos

    def node_ids(self, order: Sequence[int]) -> list[int]:
        """Graph node ids of an order of node indices."""
        return [self.ids[v] for v in order]

    def indices(self, order: Sequence[int]) -> list[int]:
        """Node indices of an order of graph node ids."""
        try:
            return [self.index[nid] for nid in order]
        except KeyError as e:
            raise GraphError(f"order names node {e.args[0]}, which is not in the graph") from None

    def is_topological(self, order: Sequence[int]) -> bool:
        if len(order) != self.n or len(set(order)) != self.n:
            return False
        pos = self.to_positions(order)
        return all(pos[p] < pos[v] for v in range(self.n) for p in self.preds[v])

    # ------------------------------------------------------------ memory
    def intervals(self, order: Order) -> tuple[Int64Array, Int64Array]:
        """Per storage: (position of its first touch, position of its last) in `order`
        (n - 1 for program output storages)."""
        return spans(self.storage_touches, self.to_positions(order))

    def curve(self, order: Order) -> OrderMemory:
        """Memory timeline of an order of node indices (the step simulation's rules)."""
        n = self.n
        if n == 0:
            return OrderMemory(np.zeros(0, dtype=np.int64), self.baseline, 0)
        first, last = self.intervals(order)
        live = live_bytes(self.size, first, last, n)
        timeline = live + self.baseline + self.workspace[np.asarray(order, dtype=np.int64)]
        peak_index = int(np.argmax(timeline))
        return OrderMemory(timeline, int(timeline[peak_index]), peak_index)

    def peak(self, order: Order) -> int:
        return self.curve(order).peak_bytes

    def eager_order(self) -> list[int]:
        return list(range(self.n))
