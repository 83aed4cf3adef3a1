"""recompute_activations: the backward reads recomputes of the step's cheap saved activations
(peakcut.transform.activations), as one rewrite of the base graph. Sites: all of them, and the
first half in forward order (in a CNN the first layers run at the highest resolution and hold
the most). The search keeps a site where its recompute pays for the memory it frees; there
is no inverse rule (the search starts again from the unrewritten base instead)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.query import Query
from peakcut.transform.activations import (
    recompute_activations,
    saved_activations,
    why_not_recompute_activation,
)
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.site import RewriteSite


class RecomputeActivationsRule(RewriteRule):
    """Saved element-wise activations (and the cheap ops behind them) recomputed for the backward."""

    kind = "recompute_activations"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g, order = query.g, query.order
        ready = [v for v in saved_activations(g) if why_not_recompute_activation(g, order, v, exact=False) is None]
        if ready:
            yield RewriteSite(self.kind, tuple(ready), f"recompute {len(ready)} saved activations")
        if len(ready) >= 4:
            half = ready[:len(ready) // 2]
            yield RewriteSite(self.kind, tuple(half), f"recompute the first {len(half)} saved activations")

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        reasons = [why_not_recompute_activation(g, order, v, exact=False) for v in site.nodes]
        return None if None in reasons else reasons[0]

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        done, reasons = recompute_activations(g, order, site.nodes)
        if done is None:
            raise RuleError(next(r for r in reasons if r))
        return done

    def describe(self, query: Query, site: RewriteSite) -> str:
        return site.description
