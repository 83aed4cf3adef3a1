"""Placement of the nodes rules add (MAGIS §5.2; the reference code never did loads).

The rules say where each of their nodes goes (peakcut.rules: Registry.placements), one of
- EARLY: as early as possible, right after its last predecessor (a swap's store);
- LATE: right before its first successor (a recompute);
- HIDDEN: as late as its transfer can still be hidden: issued early enough that the compute
  nodes between it and its first successor take at least its time (when copies overlap
  compute; on CPU they do not, so it runs right before the successor) (a swap's load).
All EARLY nodes are placed first, in the order's sequence, then the LATE ones, then the
HIDDEN ones. Where copies overlap compute, the HIDDEN copies of one direction (h2d, then
d2h) share a stream that runs them first come first served, so they are placed as a queue,
the latest first reader first: each is hidden before its first reader or before the copies
already placed, whichever comes first. Placed one by one, a small load right before its reader
waited behind a large one issued before it for a later reader: paper U-Net at 40% of
eager's memory on RTX 3090 waited 51 ms (of a 426 ms step, simulated) for three parameter
loads queued behind 512 MiB swap-ins.

Every move keeps the order topological: a node never passes one of its
predecessors or successors.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from peakcut.cost.protocol import CostModel
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.ops import COPY_DIRECTION, is_host_copy


class Placement(Enum):
    """Where a node a rule added goes in the order (see module doc)."""

    EARLY = "early"
    LATE = "late"
    HIDDEN = "hidden"


def place(g: Graph, order: list[int], cost: CostModel | None = None, *,
          placements: Mapping[int, Placement]) -> list[int]:
    """`order` with the nodes of `placements` moved early, late or late-but-hidden (see module
    doc); placements: node -> where it goes (peakcut.rules.RULES.placements(g)).

    Raises GraphError when `order` lists a node twice.
    """
    placing = _Placing(g, list(order), placements)
    for nid in placing.in_order(Placement.EARLY):
        placing.move_early(nid)
    for nid in placing.in_order(Placement.LATE):
        placing.move_late(nid, 0.0, cost)
    hidden = placing.in_order(Placement.HIDDEN)
    if cost is None or not cost.overlap_copies:
        for nid in hidden:
            placing.move_late(nid, 0.0, cost)
        return placing.order
    for direction in ("h2d", "d2h"):
        placing.queue_late([n for n in hidden if COPY_DIRECTION.get(g.nodes[n].op) == direction], cost)
    for nid in hidden:
        if COPY_DIRECTION.get(g.nodes[nid].op) is None:
            placing.move_late(nid, cost.node_seconds(g, nid), cost)
    return placing.order


class _Placing:
    """An order being edited by single-node moves, with every node's position kept up to date.

    A move takes a node out (the rest keeps its order) and inserts it at an index of the
    rest; positions change only between the old and the new place, so a move costs the
    distance it moves the node, not the length of the order.
    """

    def __init__(self, g: Graph, order: list[int], placements: Mapping[int, Placement]) -> None:
        self.g = g
        self.order = order
        self.placements = placements
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

    def in_order(self, where: Placement) -> list[int]:
        """The nodes placed `where` that the order runs, in the order's current sequence."""
        nodes = [n for n, p in self.placements.items() if p is where]
        if not nodes:
            return nodes
        pos = self.pos
        return sorted((n for n in nodes if n in pos), key=pos.__getitem__)

    def _rest_index(self, node: int, at: int) -> int | None:
        """Index of `node` in the order without the node at position `at` (None: not there)."""
        j = self.pos.get(node)
        if j is None or j == at:
            return None
        return j if j < at else j - 1

    def _successors(self, nid: int) -> set[int]:
        """Readers of nid's outputs and nodes with a control edge to it, without nid."""
        if self._late is None:
            # every node moved late is LATE or HIDDEN: find their readers in one pass
            g = self.g
            late = [g.nodes[n] for n, where in self.placements.items() if where is not Placement.EARLY]
            readers = g.users_of(t for n in late for t in n.output_tuple)
            self._late = {n.id: {u for t in n.output_tuple for u in readers[t]} for n in late}
            for n, deps in g.control.items():
                for d in deps:
                    if d in self._late:
                        self._late[d].add(n)
        out = self._late.get(nid)
        if out is None:   # not a LATE or HIDDEN node
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

    def _first_successor(self, nid: int) -> int:
        """The index of nid's first successor in the order (its length when it has none)."""
        pos = self.pos
        return min((pos[s] for s in self._successors(nid) if s in pos), default=len(self.order))

    def queue_late(self, copies: list[int], cost: CostModel) -> None:
        """HIDDEN copies of one direction (module doc), latest first reader first (then the
        later placed first): each is hidden behind the compute before its first reader or
        before the earliest of the copies already placed, whichever comes first, so the
        stream has run it when those are due."""
        pos = self.pos
        need = {c: (self._first_successor(c), pos[c]) for c in copies}
        earliest_placed: int | None = None
        for nid in sorted(copies, key=need.__getitem__, reverse=True):
            self.move_late(nid, cost.node_seconds(self.g, nid), cost, before=earliest_placed)
            if earliest_placed is None or pos[nid] < pos[earliest_placed]:
                earliest_placed = nid

    def move_late(self, nid: int, hide_seconds: float, cost: CostModel | None, before: int | None = None) -> None:
        """Before its first successor (and before node `before`, where its predecessors
        allow), early enough that `hide_seconds` of compute precede it."""
        g = self.g
        order = self.order
        at = self.pos[nid]
        earliest = self._after_preds(nid, at)
        succ_at = [i for s in self._successors(nid) if (i := self._rest_index(s, at)) is not None]
        if before is not None and (i := self._rest_index(before, at)) is not None and i >= earliest:
            succ_at.append(i)
        first_succ = min(succ_at, default=len(order) - 1)
        index = first_succ
        covered = 0.0
        while index > earliest and covered < hide_seconds:
            prev = order[index - 1] if index - 1 < at else order[index]   # rest[index - 1]
            if is_host_copy(g.nodes[prev].op):
                index -= 1
                continue
            covered += cost.node_seconds(g, prev) if cost is not None else 0.0
            index -= 1
        self._insert(nid, at, index)
