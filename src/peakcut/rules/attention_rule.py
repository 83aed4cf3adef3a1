"""recompute_attention: each softmax's scores (the matmul of query and key, the scale and mask,
the softmax and its cast) recomputed for the backward (peakcut.transform.attention), as a
rewrite of the base graph through checkpoint_blocks. Sites: every unit, and the first half in
forward order. Like the block rules it may touch enabled fission regions (the recomputes are
base nodes, so a region that micro-batches the step recomputes each part's scores), and
uncheckpoint_blocks undoes it (the recomputes carry the unit's name)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.rules.checkpoint_rule import BlockRule
from peakcut.rules.query import Query
from peakcut.transform.attention import attention_units
from peakcut.transform.checkpoint import Block, checkpoint_blocks, why_not_checkpoint
from peakcut.transform.rewrite import Rewrite
from peakcut.transform.site import RewriteSite


class RecomputeAttentionRule(BlockRule):
    """The backward reads a recompute of every (or the first half of the) attention scores."""

    kind = "recompute_attention"

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g, order = query.g, query.order
        ready = [u for u in attention_units(g) if why_not_checkpoint(g, order, u) is None]
        if not ready:
            return
        yield _site(ready, f"recompute the attention scores of {len(ready)} softmax(es)")
        if len(ready) >= 4:
            half = ready[:len(ready) // 2]
            yield _site(half, f"recompute the attention scores of the first {len(half)} softmax(es)")

    def targets(self, g: Graph, site: RewriteSite) -> list[Any] | str:
        wanted = set(site.nodes)
        units = [u for u in attention_units(g) if set(u.nodes) <= wanted]
        if sum(len(u.nodes) for u in units) != len(wanted):
            return "the site's nodes are not attention units of this graph"
        return units

    def why_not_one(self, g: Graph, order: Sequence[int], target: Any) -> str | None:
        return why_not_checkpoint(g, order, target)

    def apply_all(self, g: Graph, order: Sequence[int], targets: list[Any]) -> tuple[Rewrite | None, list[str | None]]:
        return checkpoint_blocks(g, order, targets)


def _site(units: Sequence[Block], what: str) -> RewriteSite:
    return RewriteSite("recompute_attention", tuple(v for u in units for v in u.nodes), what)
