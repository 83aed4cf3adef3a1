"""The scheduling problem in compact integer form, and the memory of an order.

Nodes are numbered 0..n-1 in the graph's capture order. Memory follows the
spine's step semantics (peakcut.analysis.memory) exactly:

- a storage that is not caller-held and not in host memory is live from the
  first node that touches it (reads or writes a tensor in it) to the last one;
  storages of program outputs stay live to the end;
- while a node runs, its workspace is live too;
- caller-held storages (the baseline) are live all step.

`Problem.peak(order)` is a vectorised evaluation (numpy), cheap enough to be
called thousands of times on graphs of ~10k nodes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from peakcut.analysis.workspace import node_workspace
from peakcut.ir.graph import Graph, GraphError


@dataclass(frozen=True)
class MemoryCurve:
    """Bytes live while each position of an order runs."""

    timeline: np.ndarray   # int64, len n
    peak_bytes: int
    peak_index: int


class Problem:
    """A graph reduced to what ordering needs: dependencies, storages, sizes, workspaces."""

    def __init__(self, g: Graph, workspace: str | None = "cpu") -> None:
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

        held = g.caller_held_storages()
        host = g.host_storages()
        outs = g.output_storages()
        storage_index: dict[int, int] = {}
        touches: list[list[int]] = []
        for v, nid in enumerate(self.ids):
            node = g.nodes[nid]
            for t in (*node.output_ids(), *node.input_ids()):
                s = g.tensors[t].storage
                if s in held or s in host:
                    continue
                k = storage_index.setdefault(s, len(touches))
                if k == len(touches):
                    touches.append([])
                if not touches[k] or touches[k][-1] != v:
                    touches[k].append(v)
        self.storage_ids: list[int] = list(storage_index)
        self.size = np.array([g.storages[s] for s in self.storage_ids], dtype=np.int64)
        self.to_end = np.array([s in outs for s in self.storage_ids], dtype=bool)
        self.touches: list[tuple[int, ...]] = [tuple(sorted(set(t))) for t in touches]
        node_storages: list[list[int]] = [[] for _ in range(n)]
        for k, ts in enumerate(self.touches):
            for v in ts:
                node_storages[v].append(k)
        self.node_storages: list[tuple[int, ...]] = [tuple(x) for x in node_storages]
        self.baseline = int(sum(g.storages[s] for s in held))
        self.workspace = np.zeros(n, dtype=np.int64)
        if workspace is not None:
            for v, nid in enumerate(self.ids):
                self.workspace[v] = node_workspace(g, nid, workspace)
        # flattened touch lists, grouped by storage, for the vectorised evaluation
        lengths = np.array([len(t) for t in self.touches], dtype=np.int64)
        self._touch_nodes = np.fromiter((v for t in self.touches for v in t), dtype=np.int64,
                                        count=int(lengths.sum()))
        self._touch_starts = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)

    # ------------------------------------------------------------ orders
    def to_positions(self, order: Sequence[int]) -> np.ndarray:
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
    def intervals(self, order: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per storage: (position of its first touch, position of its last) in `order`."""
        pos = self.to_positions(order)
        tp = pos[self._touch_nodes]
        if not len(self.size):
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        first = np.minimum.reduceat(tp, self._touch_starts)
        last = np.maximum.reduceat(tp, self._touch_starts)
        return first, np.where(self.to_end, self.n - 1, last)

    def curve(self, order: Sequence[int]) -> MemoryCurve:
        """Memory timeline of an order of node indices (the spine's semantics)."""
        n = self.n
        if n == 0:
            return MemoryCurve(np.zeros(0, dtype=np.int64), self.baseline, 0)
        if len(self.size):
            first, last = self.intervals(order)
            delta = np.zeros(n + 1, dtype=np.int64)
            np.add.at(delta, first, self.size)
            np.add.at(delta, last + 1, -self.size)
            live = np.cumsum(delta[:n])
        else:
            live = np.zeros(n, dtype=np.int64)
        timeline = live + self.baseline + self.workspace[np.asarray(order, dtype=np.int64)]
        peak_index = int(np.argmax(timeline))
        return MemoryCurve(timeline, int(timeline[peak_index]), peak_index)

    def peak(self, order: Sequence[int]) -> int:
        return self.curve(order).peak_bytes

    def eager_order(self) -> list[int]:
        return list(range(self.n))
