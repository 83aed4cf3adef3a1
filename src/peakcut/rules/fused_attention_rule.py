"""fused_attention: written-out attention (scores matmul, scale, masks, softmax, value matmul)
run as the fused attention PyTorch picks for the device, forward and backward
(peakcut.transform.fused_attention): the scores are never held. One site: every unit that
applies, in one rewrite; tried on the search's root too (ROOT), kept where it dominates. Opt-in: in registry.WITH_FUSED, not in RULES."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import ROOT, SEARCH
from peakcut.rules.query import Query
from peakcut.transform.fused_attention import find_unit, find_units, fuse_attention, why_not_fuse
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite


class FusedAttentionRule(RewriteRule):
    """Every written-out attention that applies runs as one fused kernel (module doc)."""

    kind = "fused_attention"
    phases = frozenset({SEARCH, ROOT})   # tried on the root too: at paper size it lowers peak and latency

    def describe(self, query: Query, site: RewriteSite) -> str:
        return f"fused: {site.description}"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        ready = [u.softmax for u in find_units(query.g) if why_not_fuse(query.g, u) is None]
        if ready:
            yield RewriteSite(self.kind, tuple(ready), f"{len(ready)} attention(s) as one fused kernel each")

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        if not site.nodes:
            return "the site names no attention"
        for softmax in site.nodes:
            if softmax not in g.nodes:
                return f"node {softmax} is not in the graph"
            unit = find_unit(g, softmax)
            why = unit if isinstance(unit, str) else why_not_fuse(g, unit)
            if why is not None:
                return why
        return None

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        return fuse_attention(g, order, site.nodes, label=self.kind)
