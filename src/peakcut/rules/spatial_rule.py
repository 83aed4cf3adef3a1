"""split_rows: a convolution or a convolution's backward near the memory peak runs in n parts
along its images' rows (peakcut.transform.spatial), as one rewrite of the base graph.

Sites: the SITES convolution nodes (forward or backward) with the most bytes live while they
run (the simulated timeline of the base: their scratch, gradient and inputs are what a split
shrinks; a base with SITES or fewer takes them all, in order, without simulating it: ViT's
patch embedding), each at n = 4, 8 and 2 where the rows allow. A split at n = 2 can raise the peak (a
part's padded input and gradient beside the whole one); the search keeps a site only where
the simulated step pays for it. There is no inverse rule (the search starts again from the
unrewritten base instead).

In the polish after the search (phase POLISH, optimizer.polish): where the best plan peaks at a
convolution's backward that makes only the input gradient (split_conv_grads made it), that
call in 4 parts."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.memory import simulate
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import POLISH, SEARCH
from peakcut.rules.query import Query
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.site import RewriteSite
from peakcut.transform.spatial import (
    CONV,
    CONV_BACKWARD,
    ROWS,
    reads_input_shape_only,
    split_rows,
    why_not_split_rows,
)

SITES = 3
PARTS = (4, 8, 2)
AT_PEAK_PARTS = 4


def _parts(site: RewriteSite) -> int | str:
    if len(site.params) != 1:
        return f"site {site.description!r} does not name one number of parts"
    return site.params[0]


class SplitRowsRule(RewriteRule):
    """Convolutions (forward or backward) near the peak, run in parts along the rows."""

    kind = "split_rows"
    phases = frozenset({SEARCH, POLISH})

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g, order = query.g, query.order
        if query.peak is not None:
            site = self._at_peak(g, order, query.peak)
            if site is not None:
                yield site
            return
        convs = [i for i, v in enumerate(order) if g.nodes[v].op in (CONV, CONV_BACKWARD)]
        if len(convs) > SITES:            # ranked by the base's memory only where there is a choice
            timeline = simulate(g, order).timeline
            convs = sorted(convs, key=lambda i: -int(timeline[i]))[:SITES]
        for i in convs:
            v = order[i]
            for n in PARTS:
                if why_not_split_rows(g, order, [v], n) is None:
                    name = g.nodes[v].name or str(v)
                    yield RewriteSite(self.kind, (v,), f"split {name} in {n} parts along the rows", params=(n,))

    def _at_peak(self, g: Graph, order: Sequence[int], nid: int) -> RewriteSite | None:
        """Where a plan peaks at a convolution's backward that makes only the input gradient
        (after split_conv_grads) and reads whole tensors (not a part of an earlier split): that
        call in AT_PEAK_PARTS parts. Its parts read a shape-only view of the input, so only
        their gradient and scratch are live (peakcut.transform.spatial)."""
        node = g.nodes[nid]
        if node.op != CONV_BACKWARD or not reads_input_shape_only(g, node):
            return None
        go = node.args[0]
        made_by = g.producer(go.id) if isinstance(go, TensorRef) else None
        if made_by is not None and g.nodes[made_by].op == "aten.slice.Tensor" and g.nodes[made_by].args[1] == ROWS:
            return None          # a part of an earlier split along the rows
        if why_not_split_rows(g, order, [nid], AT_PEAK_PARTS) is not None:
            return None
        name = g.nodes[nid].name or str(nid)
        return RewriteSite(self.kind, (nid,), f"split {name} in {AT_PEAK_PARTS} parts along the rows",
                           params=(AT_PEAK_PARTS,))

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        n = _parts(site)
        return n if isinstance(n, str) else why_not_split_rows(g, order, site.nodes, n)

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        n = _parts(site)
        if isinstance(n, str):
            raise RuleError(n)
        return split_rows(g, order, site.nodes, n)

    def describe(self, query: Query, site: RewriteSite) -> str:
        return site.description
