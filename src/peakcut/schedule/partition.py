"""GraphPartition (MAGIS §6.1): cut a set of nodes into segments at narrow waists (nw <= 1).

A node v with nw(v) = 0 is comparable with every other node, so every order
runs its ancestors before it and its descendants after it: the ordering
problem splits exactly at v. With nw(v) = 1 one node floats across v; the
split costs at most that node's bytes.

Segment of a node = how many cut nodes are its ancestors. Dependencies never
go from a later segment to an earlier one, so running the segments one after
another, each in any order of its own, is a valid order.
"""

from __future__ import annotations

from collections.abc import Sequence

from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import Reachability

WAIST = 1  # nw(v) <= WAIST makes v a cut point (MAGIS §6.1)


def segments(problem: Problem, nodes: Sequence[int], waist: int = WAIST,
             reach: Reachability | None = None) -> list[list[int]]:
    """The nodes grouped into consecutive segments, each in capture (index) order.

    reach: the reachability of exactly these nodes, when the caller already has it.
    """
    reach = reach if reach is not None else Reachability(problem, nodes)
    nw = reach.narrow_waist()
    cuts = 0
    for v, value in nw.items():
        if value <= waist:
            cuts |= 1 << v
    groups: dict[int, list[int]] = {}
    for v in reach.nodes:
        groups.setdefault((reach.anc[v] & cuts).bit_count(), []).append(v)
    return [groups[k] for k in sorted(groups)]
