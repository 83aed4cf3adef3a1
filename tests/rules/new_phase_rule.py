"""A rewrite rule in a phase of its own, with a tag kind of its own (tests/rules/test_new_rule.py
registers it in a Registry next to RULES).

SETTLE runs after the search, after the polish: where the best plan peaks, the step's cheap
saved activations are recomputed for the backward (peakcut.transform.activations) and kept
while the objective prefers it. Every recompute it adds carries a SettledTag, which the graph
JSON writes under its own kind, "settled". Nothing outside this file names the phase, the
rule or the tag.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar

from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import Graph
from peakcut.ir.tags import Tag
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import Phase
from peakcut.rules.query import Query
from peakcut.transform.activations import (
    recompute_activations,
    saved_activations,
    why_not_recompute_activation,
)
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.site import RewriteSite

SETTLE = Phase("settle", "after")


@dataclass(frozen=True, slots=True)
class SettledTag(Tag):
    """A recompute the settle phase added, and the peak node it was added at."""

    kind: ClassVar[str] = "settled"
    at: int

    def to_json(self) -> dict[str, Any]:
        return {"at": self.at}

    @classmethod
    def from_json(cls, doc: Any) -> SettledTag:
        return cls(int(doc["at"]))


class SettleActivationsRule(RewriteRule):
    """The saved activations recomputed for the backward, once the plan is found (module doc)."""

    kind = "settle_activations"
    phases = frozenset({SETTLE})

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        g, order = query.g, query.order
        if query.peak is None:
            return
        ready = [v for v in saved_activations(g) if why_not_recompute_activation(g, order, v, exact=False) is None]
        if ready:
            yield RewriteSite(self.kind, tuple(ready), f"settle {len(ready)} saved activations",
                              (query.peak,))

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        reasons = [why_not_recompute_activation(g, order, v, exact=False) for v in site.nodes]
        return None if None in reasons else reasons[0]

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        done, reasons = recompute_activations(g, order, site.nodes)
        if done is None:
            raise RuleError(next(r for r in reasons if r))
        edit = GraphEditor(done.graph)
        tag = SettledTag(site.params[0])
        for nid in done.added:
            node = edit.graph.nodes[nid]
            edit.replace_node(replace(node, tags=node.tags.with_tag(tag)))
        return replace(done, graph=edit.finish())

    def describe(self, query: Query, site: RewriteSite) -> str:
        return f"settle: {site.description}"
