"""Pricing a compact fission expansion (peakcut.fission.expand(compact=True)).

The search evaluates a fission state on a graph that holds part 0 of every enabled region
only. A part node runs once per part of every region around it, so it is priced that many
times; the keep-alive aliases that hold region inputs live through part 0 cost nothing.
The memory curve needs no correction (see the expand module doc); with swaps or recomputes
placed around a region, the copy stream overlaps one long part-0 node instead of n short
ones, which is why the optimizer re-derives its result on the full expansion
(Deriver.exact) before reporting it.
"""

from __future__ import annotations

from math import prod

from peakcut.cost.protocol import CostModel, issue_seconds
from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.ir.tags import FissionTag


class RepeatedCost:
    """A cost model pricing the nodes of a compact expansion under `tree` (see module doc)."""

    def __init__(self, cost: CostModel, tree: FTree) -> None:
        self.cost = cost
        self.name = cost.name
        self.overlap_copies = cost.overlap_copies
        self._n = {f.id: f.n for f in tree.enabled()}

    def repeat(self, g: Graph, nid: int) -> int:
        """How many times node `nid` of the compact graph runs in the full expansion."""
        tag = g.nodes[nid].tags.get(FissionTag)
        path = tag.path if tag is not None else ()
        return prod(self._n[f] for f, _ in path) if path else 1

    def node_seconds(self, g: Graph, nid: int) -> float:
        tag = g.nodes[nid].tags.get(FissionTag)
        if tag is not None and tag.role == "keep":
            return 0.0
        seconds = self.cost.node_seconds(g, nid)
        return seconds * self.repeat(g, nid) if tag is not None else seconds

    def issue_seconds(self, g: Graph, nid: int) -> float:
        """The host's issue seconds (peakcut.cost.issue_seconds), repeated like node_seconds."""
        tag = g.nodes[nid].tags.get(FissionTag)
        if tag is not None and tag.role == "keep":
            return 0.0
        seconds = issue_seconds(self.cost, g, nid)
        return seconds * self.repeat(g, nid) if tag is not None else seconds

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        return self.cost.copy_seconds(nbytes, direction)
