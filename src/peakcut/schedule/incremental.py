"""Incremental rescheduling (MAGIS Algorithm 2): after a local change, re-order only an interval.

Given the previous graph's order and the nodes a rule added or changed, the
interval to redo is grown outward from the changed span to boundary nodes
with small narrow-waist values (GetRescheduleInterval, §6.1): each side
scans up to `reach` positions (MAGIS: 20) for the nearest node with
nw <= `good` (MAGIS: 4); failing that it takes the smallest nw seen, and if
even that exceeds `acceptable` (MAGIS: 10) it falls back to full scheduling.
The interval's nodes, in the new graph, are partitioned at narrow waists and
re-ordered by the DP (schedule_interval); the result is spliced between the
untouched prefix and suffix. If the splice is not a valid order of the new
graph (a changed node's dependencies leave the interval), the whole graph is
scheduled instead. Added nodes go into the interval, except those the caller
names `early` (a swap's store): right after their last predecessor, before
the interval where that lies before it, as placement would put them.

CUTS, a second rule, bounds the interval by true cuts (nw == 0: every other
node runs before or after the boundary) within the same reach: a wider
interval that lets the DP run a reader independent of the changed nodes
before them (the reader of a narrow tensor ahead of a swapped-in wide one).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from peakcut.ir.graph import Graph, GraphError
from peakcut.schedule.full import Schedule, schedule
from peakcut.schedule.interval import IntervalSettings, IntervalStats, schedule_interval
from peakcut.schedule.problem import Problem


@dataclass(frozen=True)
class IntervalRule:
    """GetRescheduleInterval's constants (MAGIS §6.1: 20, 10, 4)."""

    reach: int = 20
    acceptable: int = 10
    good: int = 4


CUTS = IntervalRule(acceptable=0, good=0)
"""Boundaries at true cuts only (module doc)."""


@dataclass(frozen=True)
class IncrementalResult:
    order: list[int]          # node ids of the new graph
    peak_bytes: int
    seconds: float
    interval: tuple[int, int]  # [start, stop) positions rescheduled in the new order; (0, n) if full
    fell_back: str            # why full scheduling was used ('' when incremental)


def reschedule_interval(order: Sequence[int], narrow_waist: dict[int, int], changed: Iterable[int],
                        rule: IntervalRule = IntervalRule()) -> tuple[int, int] | None:
    """[start, stop) positions of `order` to reschedule around the changed nodes, or None (use full).

    order: node ids of the previous schedule; narrow_waist: node id -> nw in the
    previous graph; changed: node ids of the previous graph that the change touched.
    """
    pos = {nid: i for i, nid in enumerate(order)}
    spots = [pos[c] for c in changed if c in pos]
    if not spots:
        return None
    lo, hi = min(spots), max(spots)
    start = _boundary(order, narrow_waist, range(lo - 1, max(-1, lo - 1 - rule.reach), -1), rule)
    stop = _boundary(order, narrow_waist, range(hi + 1, min(len(order), hi + 1 + rule.reach)), rule)
    if start is None or stop is None:
        return None
    return start, stop + 1


def _boundary(order: Sequence[int], nw: dict[int, int], scan: range, rule: IntervalRule) -> int | None:
    """Position of the boundary node on one side (the interval includes it)."""
    best, best_nw = None, None
    for p in scan:
        value = nw.get(order[p], rule.acceptable + 1)
        if value <= rule.good:
            return p
        if best_nw is None or value < best_nw:
            best, best_nw = p, value
    if best is None:  # the changed span touches the end of the order
        return scan.start - scan.step if len(scan) == 0 else scan[-1]
    if best_nw is not None and best_nw > rule.acceptable:
        return None
    return best


def incremental_schedule(old_order: Sequence[int], narrow_waist: dict[int, int], new_graph: Graph,
                         changed: Iterable[int], added: Iterable[int] = (),
                         settings: IntervalSettings | None = None, rule: IntervalRule = IntervalRule(),
                         time_limit: float = 20.0, early: Iterable[int] = ()) -> IncrementalResult:
    """Order for `new_graph` from the previous order, rescheduling one interval (Algorithm 2).

    changed: ids of nodes of the previous graph that the rule rewired or
    removed; added: ids of new nodes (placed inside the interval, those in
    `early` right after their last predecessor: module doc).
    """
    t0 = time.perf_counter()
    settings = settings or IntervalSettings()
    added = [a for a in added if a in new_graph.nodes]
    changed = list(changed)
    span = reschedule_interval(old_order, narrow_waist, changed, rule)
    if span is None:
        return _full(new_graph, t0, settings, time_limit, "no interval with a narrow enough boundary")
    start, stop = span
    kept = [nid for nid in old_order if nid in new_graph.nodes]
    before = [nid for nid in old_order[:start] if nid in new_graph.nodes]
    middle = [nid for nid in old_order[start:stop] if nid in new_graph.nodes]
    after = [nid for nid in old_order[stop:] if nid in new_graph.nodes]
    if len(kept) + len(added) != len(new_graph.nodes):
        return _full(new_graph, t0, settings, time_limit, "the change touched nodes the old order does not know")
    first = set(early)
    middle = _with_added(new_graph, middle, [a for a in added if a not in first])
    spliced, lo, hi = _with_early(new_graph, before + middle + after, len(before), len(before) + len(middle),
                                  [a for a in added if a in first])
    try:
        problem = Problem(new_graph.with_order(spliced))
    except GraphError:  # the splice is not topological
        return _full(new_graph, t0, settings, time_limit, "the change reaches outside the interval")
    order = problem.eager_order()  # == spliced, as node indices
    result = schedule_interval(problem, order, lo, hi, settings, IntervalStats())
    return IncrementalResult(problem.node_ids(result), problem.peak(result), time.perf_counter() - t0,
                             (lo, hi), "")


def _with_added(g: Graph, middle: list[int], added: list[int]) -> list[int]:
    """Insert new nodes into the interval: each just before its first user in it, else after its
    last predecessor in it, else first. Rules list added nodes producers first, so they are
    placed last to first (a load before its user, then its store before the load)."""
    out = list(middle)
    for a in reversed(added):
        outputs = set(g.nodes[a].output_ids())
        users = {nid for nid in out if outputs.intersection(g.nodes[nid].input_ids())
                 or a in g.control.get(nid, ())}
        at = next((i for i, nid in enumerate(out) if nid in users), None)
        if at is None:
            preds = g.predecessors(a)
            at = max((i + 1 for i, nid in enumerate(out) if nid in preds), default=0)
        out.insert(at, a)
    return out


def _with_early(g: Graph, order: list[int], lo: int, hi: int, early: list[int]) -> tuple[list[int], int, int]:
    """`order` with each `early` node right after its last predecessor in it (first where it has
    none), producers first, and the interval [lo, hi) shifted to keep its nodes."""
    out = list(order)
    for a in early:
        preds = g.predecessors(a)
        at = max((i + 1 for i, nid in enumerate(out) if nid in preds), default=0)
        out.insert(at, a)
        if at <= lo:        # its predecessors lie before the interval: so does it
            lo, hi = lo + 1, hi + 1
        elif at <= hi:
            hi += 1
    return out, lo, hi


def _full(g: Graph, t0: float, settings: IntervalSettings, time_limit: float, why: str) -> IncrementalResult:
    s: Schedule = schedule(g, time_limit=time_limit, settings=settings)
    return IncrementalResult(s.order, s.peak_bytes, time.perf_counter() - t0, (0, len(s.order)), why)
