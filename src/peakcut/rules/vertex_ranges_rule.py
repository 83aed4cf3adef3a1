"""split_vertex_ranges: every sum over a graph's edges run in n edge ranges
(peakcut.transform.vertex_ranges), as one rewrite of the base graph.

A site is a number of parts for all the edge chains of the step that split (a GNN's
gathers, per-edge messages and index_add sums, forward and backward): one edit splits them
all, so the step's largest per-edge working set shrinks by n wherever it was. The parts are
plain ops, priced on the timeline like any node; the search keeps the rewrite where the
objective prefers it (a memory limit below the per-edge messages).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import ROOT, SEARCH
from peakcut.rules.query import Query
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.site import RewriteSite
from peakcut.transform.vertex_ranges import (
    EdgeChain,
    find_edge_chains,
    split_edge_chains,
    why_not_split,
)

PARTS: tuple[int, ...] = (16, 4, 64)
"""The numbers of parts the rule offers, in the order the search tries them."""


class SplitVertexRangesRule(RewriteRule):
    """Sums over a graph's edges (index_add over per-edge messages) in n edge ranges."""

    kind = "split_vertex_ranges"
    phases = frozenset({ROOT, SEARCH})

    def __init__(self, parts: Sequence[int] = PARTS) -> None:
        if not parts or any(n < 2 for n in parts):
            raise ValueError(f"parts={tuple(parts)}: each number of parts must be >= 2")
        self.parts = tuple(parts)

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g = query.g
        chains = find_edge_chains(g)
        for n in self.parts:
            ready = [c.sink for c in chains if why_not_split(g, c, n) is None]
            if ready:
                yield RewriteSite(self.kind, tuple(ready), f"{len(ready)} sums over edges in {n} edge ranges",
                                  params=(n,))

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        targets = _targets(g, site)
        if isinstance(targets, str):
            return targets
        reasons = [why_not_split(g, c, site.params[0]) for c in targets]
        return None if None in reasons else reasons[0]

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        targets = _targets(g, site)
        if isinstance(targets, str):
            raise RuleError(targets)
        done, reasons = split_edge_chains(g, order, targets, site.params[0])
        if done is None:
            raise RuleError(next(r for r in reasons if r))
        return done

    def describe(self, query: Query, site: RewriteSite) -> str:
        return site.description


def _targets(g: Graph, site: RewriteSite) -> list[EdgeChain] | str:
    """The chains the site names, as they are in g."""
    if len(site.params) != 1:
        return f"a {site.kind} site needs one parameter, the number of parts; got {site.params}"
    found = {c.sink: c for c in find_edge_chains(g)}
    missing = [v for v in site.nodes if v not in found]
    if missing:
        return f"node {missing[0]} is not an unsplit sum over edges of this graph"
    return [found[v] for v in site.nodes]
