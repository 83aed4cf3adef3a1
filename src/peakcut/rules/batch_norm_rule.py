"""split_batch_norms: every training-mode batch norm rewritten as ops a batch split can cross
(peakcut.transform.batch_norm), as one rewrite of the base graph.

One site: all the batch norms that can be rewritten. The F-Tree found again on the new base
has batch regions that span batch norms (their statistics are per-sample reductions, summed
over the parts). The rewritten step alone is a little slower than the fused kernels and no
smaller; the search keeps it where the regions it opens pay for that.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from peakcut.ir.graph import Graph
from peakcut.rules.base import RewriteRule
from peakcut.rules.query import Query
from peakcut.transform.batch_norm import (
    BatchNormSite,
    find_batch_norms,
    split_batch_norms,
    why_not_split,
)
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.site import RewriteSite


class SplitBatchNormsRule(RewriteRule):
    """Training-mode batch norms (and their backwards) as batch-splittable ops."""

    kind = "split_batch_norms"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g = query.g
        ready = [s.forward for s in find_batch_norms(g) if why_not_split(g, s) is None]
        if ready:
            yield RewriteSite(self.kind, tuple(ready), f"split {len(ready)} batch norms for batch fission")

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        targets = _targets(g, site)
        if isinstance(targets, str):
            return targets
        reasons = [why_not_split(g, s) for s in targets]
        return None if None in reasons else reasons[0]

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        targets = _targets(g, site)
        if isinstance(targets, str):
            raise RuleError(targets)
        done, reasons = split_batch_norms(g, order, targets)
        if done is None:
            raise RuleError(next(r for r in reasons if r))
        return done

    def describe(self, query: Query, site: RewriteSite) -> str:
        return site.description


def _targets(g: Graph, site: RewriteSite) -> list[BatchNormSite] | str:
    """The batch norms the site names, as they are in g."""
    found = {s.forward: s for s in find_batch_norms(g)}
    missing = [v for v in site.nodes if v not in found]
    if missing:
        return f"node {missing[0]} is not a training-mode batch norm of this graph"
    return [found[v] for v in site.nodes]
