"""A rewrite applied item by item, each judged on the graph the ones before made, the
rewrites composed into one."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from peakcut.ir.graph import Graph
from peakcut.transform.rewrite import Rewrite, compose_rewrites

T = TypeVar("T")


def one_by_one(g: Graph, order: Sequence[int], items: Sequence[T],
               why_not: Callable[[Graph, Sequence[int], T], str | None],
               apply: Callable[[Graph, Sequence[int], T], Rewrite], plural: str
               ) -> tuple[Rewrite | None, list[str | None]]:
    """`apply` at each item where `why_not` says None, each judged on the graph the ones before
    made: the rewrites as one (described by the one's own words, or `plural` with {n} the
    count; None when none applied) and, per item, why not (None: applied)."""
    reasons: list[str | None] = []
    steps: list[Rewrite] = []
    for item in items:
        h, o = (g, order) if not steps else (steps[-1].graph, steps[-1].order)
        reason = why_not(h, o, item)
        reasons.append(reason)
        if reason is None:
            steps.append(apply(h, o, item))
    if not steps:
        return None, reasons
    what = steps[0].description if len(steps) == 1 else plural.format(n=len(steps))
    return compose_rewrites(g, steps, what), reasons

