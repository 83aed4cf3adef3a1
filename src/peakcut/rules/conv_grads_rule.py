"""split_conv_grads: a convolution's backward runs as two calls, the weight (and bias) gradient
first, then the input gradient, so the input gradient is not held while the weight gradient's
scratch is taken (peakcut.transform.taso.conv_grads).

Sites: the convolution backward with the largest input gradient (the first in the order among
equals; no simulation, since sites are listed for every base the search makes). The rule's
main use is the polish (phase POLISH): after the search, the plan's peak, where it sits at a
convolution's backward (optimizer.polish); the search itself meets the base's peak only. There
is no inverse rule."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import POLISH, SEARCH
from peakcut.rules.query import Query
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite
from peakcut.transform.taso.conv_grads import (
    RULE,
    conv_grads_sites,
    split_conv_grads,
    why_not_split_conv_grads,
)


class SplitConvGradsRule(RewriteRule):
    """A convolution's backward as a weight-gradient call, then an input-gradient call."""

    kind = RULE
    phases = frozenset({SEARCH, POLISH})

    def _site(self, g: Graph, nid: int) -> RewriteSite:
        return RewriteSite(self.kind, (nid,), f"{g.nodes[nid].name or nid} runs as two calls: weight "
                                                "gradient, then input gradient")

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        """During the search, the convolution backward with the largest input gradient; after
        it, the node where the plan peaks, if it is a convolution backward the rule splits."""
        g, order = query.g, query.order
        if query.peak is not None:
            if why_not_split_conv_grads(g, order, query.peak, checked=True) is None:
                yield self._site(g, query.peak)
            return

        def input_gradient_bytes(v: int) -> int:
            grad = g.nodes[v].outputs[0]
            return 0 if grad is None else g.tensors[grad].nbytes

        found = conv_grads_sites(g, order)
        if found:       # no simulation: sites are listed for every base the search makes
            yield self._site(g, max(found, key=input_gradient_bytes))

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        for nid in site.nodes:
            reason = why_not_split_conv_grads(g, order, nid)
            if reason:
                return reason
        return None

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        return split_conv_grads(g, order, site.nodes)

    def describe(self, query: Query, site: RewriteSite) -> str:
        return f"{self.kind}: {site.description}"
