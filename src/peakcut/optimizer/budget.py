"""A measured cost model that stops measuring when the time budget runs out.

Measuring a call the first time it is seen takes tens of milliseconds; a fissioned or
swapped program brings many new calls. Within the budget the first unknown call of a graph
has all of the graph's unknown calls measured together (and cached), none of it running on
past the deadline by more than a round of timings; past the deadline, unknown calls are
priced by the measured model's own analytic fallback and counted, so the report can say
how many figures are estimates.
"""

from __future__ import annotations

import time

from peakcut.cost.measured import MeasuredCostModel
from peakcut.ir.graph import Graph


class BudgetedCost:
    """CostModel over a MeasuredCostModel, measuring only before `deadline` (perf_counter)."""

    def __init__(self, measured: MeasuredCostModel, deadline: float) -> None:
        self.measured = measured
        self.deadline = deadline
        self.name = measured.name
        self.overlap_copies = measured.overlap_copies
        self.estimated: set[tuple[str, tuple]] = set()

    def node_seconds(self, g: Graph, nid: int) -> float:
        if not self.measured.known(g, nid) and time.perf_counter() < self.deadline:
            self.measured.profile(g, self.deadline)    # every new call of g at once, up to the deadline
        if self.measured.known(g, nid):
            return self.measured.node_seconds(g, nid)
        node = g.nodes[nid]
        self.estimated.add((node.op, tuple(g.tensors[t].shape for t in node.input_ids())))
        return self.measured.estimate(g, nid)

    def copy_seconds(self, nbytes: int, direction: str) -> float:
        return self.measured.copy_seconds(nbytes, direction)
