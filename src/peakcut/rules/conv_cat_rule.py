"""split_conv_cat: convolutions over a channel concatenation run per concatenated tensor, so the
concatenation (a copy autograd keeps for the backward) is never made (peakcut.transform.taso.
conv_cat).

Sites: every applicable concatenation at once first (where there are two or more: U-Net's
decoder stages, U-Net++'s nested skips, a NASNet cell's projection), then each one alone, most
bytes first. There is no inverse rule (the search starts again from the unrewritten base)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import ROOT, SEARCH
from peakcut.rules.query import Query
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite
from peakcut.transform.taso.conv_cat import (
    RULE,
    conv_cat_sites,
    split_conv_cat,
    why_not_split_conv_cat,
)
from peakcut.transform.taso.matmul import CAT
from peakcut.units import format_bytes


class SplitConvCatRule(RewriteRule):
    """Convolutions (and their backwards) over a concatenation run once per concatenated tensor.
    A site's nodes are everything the rewrite removes (the cats first), so the search keeps it
    out of enabled fission regions."""

    kind = RULE
    phases = frozenset({SEARCH, ROOT})   # at paper size U-Net's step is 8% lower and 0.3% faster (RTX 3090, simulated)

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g, order = query.g, query.order
        plans = conv_cat_sites(g, order)

        def size(cats: Sequence[int]) -> str:
            return format_bytes(sum(g.tensors[g.nodes[c].output_ids()[0]].nbytes for c in cats))

        if len(plans) > 1:
            cats = tuple(p.cat for p in plans)
            yield RewriteSite(self.kind, tuple(v for p in plans for v in p.touched(g)),
                                f"convolutions over all {len(cats)} concatenations run per concatenated tensor "
                                f"({size(cats)} of copies go)")
        for p in plans:
            name = g.nodes[p.cat].name or str(p.cat)
            yield RewriteSite(self.kind, p.touched(g), f"convolutions over {name} run per concatenated tensor "
                                                         f"({size((p.cat,))} copy goes)")

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        for cat in site.nodes:      # the cats, their readers and slices (ConvCat.touched)
            if cat in g.nodes and g.nodes[cat].op != CAT:
                continue
            reason = why_not_split_conv_cat(g, order, cat)
            if reason:
                return reason
        return None

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        return split_conv_cat(g, order, site.nodes)

    def describe(self, query: Query, site: RewriteSite) -> str:
        return f"{self.kind}: {site.description}"
