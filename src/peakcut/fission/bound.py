"""How low exact batch fission could take the peak: a bound that holds for every F-Tree.

A node that no batch region can contain (a training-mode batch norm, whose
statistics need the whole batch, or any node that carries no batch label)
runs on whole tensors in every fissioned program. A storage allocated by an
ancestor of such a node v (or v itself) and read by a descendant (or v)
cannot become internal to a region either: a convex region holding both ends
would hold v. So those bytes are live while v runs, whatever is split and
however it is ordered, and

    batch_fission_bound = max over unsplittable v of forced(v)

(peakcut.schedule.reach.forced_memory) is a peak no exact batch fission goes
below. For a CNN whose peak sits at a batch norm's backward it is within a
percent of the eager peak: there, only re-materialization or swapping help.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from peakcut.fission.build import batch_components
from peakcut.fission.dgraph import DGraph, build_dgraph
from peakcut.ir.graph import Graph
from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import Reachability, forced_memory


@dataclass(frozen=True)
class FissionBound:
    """The bound (bytes) and the unsplittable node where it is reached (None: no such node)."""

    bytes: int
    node: int | None


def batch_fission_bound(g: Graph, dgraph: DGraph | None = None) -> FissionBound:
    """The peak below which no exact split along the batch dimension can go (see module doc)."""
    dgraph = dgraph or build_dgraph(g)
    splittable: set[int] = set()
    for comp, _ in batch_components(g, dgraph):
        splittable |= set(comp.labels)
    problem = Problem(g)
    if problem.n == 0:
        return FissionBound(problem.baseline, None)
    forced = forced_memory(problem, Reachability(problem))
    fixed = np.array([nid not in splittable for nid in problem.ids], dtype=bool)
    if not fixed.any():
        return FissionBound(problem.baseline, None)
    k = int(np.argmax(np.where(fixed, forced, -1)))
    return FissionBound(int(forced[k]), problem.ids[k])
