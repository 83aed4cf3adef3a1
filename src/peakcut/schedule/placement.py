"""Placement of swap and recompute nodes in an order (MAGIS §5.2; the reference code never did loads).

- a Store runs as early as possible: right after the node that produces its tensor;
- a Load runs as late as its transfer can still be hidden: it is issued early
  enough that the compute nodes between it and its first consumer take at
  least the transfer time (when copies overlap compute; on CPU they do not,
  so it runs right before the consumer);
- a recompute runs right before its first consumer.

Every move keeps the order topological: a node never passes one of its
predecessors or successors.
"""

from __future__ import annotations

from peakcut.cost.protocol import CostModel
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.ops import LOAD_OP, STORE_OP


def place(g: Graph, order: list[int], cost: CostModel | None = None) -> list[int]:
    """`order` with stores early, loads just early enough, recomputes late (see module doc).

    Raises GraphError when `order` lists a node twice.
    """
    placing = _Placing(g, list(order))
    for nid in [n for n in placing.order if g.nodes[n].op == STORE_OP]:
        placing.move_early(nid)
    for nid in [n for n in placing.order if "remat_of" in g.nodes[n].extra]:
        placing.move_late(nid, 0.0, cost)
    for nid in [n for n in placing.order if g.nodes[n].op == LOAD_OP]:
        seconds = cost.node_seconds(g, nid) if cost is not None and cost.overlap_copies else 0.0
        placing.move_late(nid, seconds, cost)
    return placing.order


class _Placing:
    """An order being edited by single-node moves, with every node's position kept up to date.

    A move takes a node out (the rest keeps its order) and inserts it at an index of the
    rest; positions change only between the old and the new place, so a move costs the
    distance it moves the node, not the length of the order.
    """

    def __init__(self, g: Graph, order: list[int]) -> None:
        self.g = g
        self.order = order
        self._pos: dict[int, int] | None = None
        self._late: dict[int, set[int]] | None = None

    @property
    def pos(self) -> dict[int, int]:
        """Node -> its index in self.order (built at the first move)."""
        if self._pos is None:
            order = self.order
            self._pos = dict(zip(order, range(len(order)), strict=True))
            if len(self._pos) != len(order):
                twice = next(n for i, n in enumerate(order) if self._pos[n] != i)
                raise GraphError(f"order runs node {twice} twice")
        return self._pos

    def _rest_index(self, node: int, at: int) -> int | None:
        """Index of `node` in the order without the node at position `at` (None: not there)."""
        j = self.pos.get(node)
        if j is None or j == at:
            return None
        return j if j < at else j - 1

    def _successors(self, nid: int) -> set[int]:
        """Readers of nid's outputs and nodes with a control edge to it, without nid."""
        if self._late is None:
            # every node moved late is a recompute or a load: find their readers in one pass
            g = self.g
            late = [n for n in g.nodes.values() if n.op == LOAD_OP or "remat_of" in n.extra]
            readers = g.users_of(t for n in late for t in n.output_tuple)
            self._late = {n.id: {u for t in n.output_tuple for u in readers[t]} for n in late}
            for n, deps in g.control.items():
                for d in deps:
                    if d in self._late:
                        self._late[d].add(n)
        out = self._late.get(nid)
        if out is None:   # not a recompute or a load
            g = self.g
            out = {u for t in g.nodes[nid].output_tuple for u in g.users(t)}
            out |= {n for n, deps in g.control.items() if nid in deps}
        out = set(out)
        out.discard(nid)
        return out

    def _after_preds(self, nid: int, at: int) -> int:
        """The first index of the rest after every predecessor of nid (0 when none is there)."""
        found = [i for p in self.g.predecessors(nid) if (i := self._rest_index(p, at)) is not None]
        return max(found, default=-1) + 1

    def _insert(self, nid: int, at: int, index: int) -> None:
        """Move nid from position `at` to index `index` of the rest."""
        order = self.order
        order.pop(at)
        order.insert(index, nid)
        pos = self.pos
        for k in range(min(at, index), max(at, index) + 1):
            pos[order[k]] = k

    def move_early(self, nid: int) -> None:
        """Right after the last of its predecessors."""
        at = self.pos[nid]
        self._insert(nid, at, self._after_preds(nid, at))

    def move_late(self, nid: int, hide_seconds: float, cost: CostModel | None) -> None:
        """Before its first successor, early enough that `hide_seconds` of compute precede it."""
        g = self.g
        order = self.order
        at = self.pos[nid]
        succ_at = [i for s in self._successors(nid) if (i := self._rest_index(s, at)) is not None]
        first_succ = min(succ_at, default=len(order) - 1)
        earliest = self._after_preds(nid, at)
        index = first_succ
        covered = 0.0
        while index > earliest and covered < hide_seconds:
            prev = order[index - 1] if index - 1 < at else order[index]   # rest[index - 1]
            if g.nodes[prev].op in (STORE_OP, LOAD_OP):
                index -= 1
                continue
            covered += cost.node_seconds(g, prev) if cost is not None else 0.0
            index -= 1
        self._insert(nid, at, index)
