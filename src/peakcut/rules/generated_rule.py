"""generated: the generated substitutions (peakcut.taso: enumerated, proved, pruned; rules.json)
as one rewrite rule. A site is a node whose result a rule's source graph computes
(taso.match); applying it computes that result by the rule's destination graph instead
(taso.calls, put in place by transform.taso.substitute). The search prices the rewritten
program with its cost model, as it prices every rewrite. Only rules whose destination has
fewer ops than their source are used: a rule between graphs of one size (add(b, a) =>
add(a, b)) would fire again on its own result.

In RULES right after split_conv_cat, so that each expanded state tries one of its sites.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import cache

from peakcut.ir.graph import Graph
from peakcut.ir.node import TensorRef
from peakcut.rules.base import RewriteRule
from peakcut.rules.query import Query
from peakcut.taso import Rule, load
from peakcut.taso.calls import Ref, calls
from peakcut.taso.match import Match, RuleIndex, find_matches, match
from peakcut.taso.term import size
from peakcut.transform.rewrite import Rewrite, RuleError
from peakcut.transform.site import RewriteSite
from peakcut.transform.taso.substitute import Slot, substitute, why_not_substitute

Planned = tuple[int, list[tuple[str, tuple[object, ...]]], TensorRef | Slot]
"""A site's substitution: the node replaced, the destination's calls, its result."""


def _shrinking(rules: Sequence[Rule]) -> tuple[Rule, ...]:
    return tuple(r for r in rules if size(r.dst) < size(r.src))


@cache
def _shipped() -> tuple[Rule, ...]:
    """The shipped set's shrinking rules, read once (the file is part of the package)."""
    return _shrinking(load().rules)


class GeneratedRule(RewriteRule):
    """A generated substitution at a site of its source graph (module doc). rules: the set to
    use (default: the shipped rules.json, read on first use)."""

    kind = "generated"

    def __init__(self, rules: Sequence[Rule] | None = None) -> None:
        self._given = None if rules is None else _shrinking(rules)
        self._index: RuleIndex | None = None

    def rules(self) -> tuple[Rule, ...]:
        """The rules used: the shrinking ones of those given, or of the shipped set."""
        return _shipped() if self._given is None else self._given

    def rule_of(self, site: RewriteSite) -> Rule | None:
        """The rule a site of this rule applies (None: the site names none)."""
        rules = self.rules()
        if site.kind != self.kind or len(site.params) != 1 or not 0 <= site.params[0] < len(rules):
            return None
        return rules[site.params[0]]

    def describe(self, query: Query, site: RewriteSite) -> str:
        return f"generated: {site.description}"

    def _rule_index(self) -> RuleIndex:
        """The rules indexed for matching, built on first use (every state's scan reads it)."""
        if self._index is None:
            self._index = RuleIndex(self.rules())
        return self._index

    def sites(self, query: Query) -> Iterator[RewriteSite]:
        rules = self.rules()
        index = self._rule_index()
        for m in find_matches(query.g, index, query.order):
            node = query.g.producer(m.root)
            if node is not None:
                at = index.position[m.rule]
                yield RewriteSite(self.kind, (node,), rules[at].describe(), params=(at,))

    def _plan(self, g: Graph, site: RewriteSite) -> Planned | str:
        rule = self.rule_of(site)
        if rule is None:
            return f"site {site.description!r} names no rule of the set"
        node = site.nodes[0] if len(site.nodes) == 1 else -1
        if node not in g.nodes or len(g.nodes[node].output_ids()) != 1:
            return f"site {site.description!r}: node {node} is not a one-result node of the graph"
        m: Match | None = match(g, rule, g.nodes[node].output_ids()[0])
        if m is None:
            return f"{rule.describe()}: its source no longer matches at node {node}"
        seq, root = calls(rule.dst, rule.inputs, m.sizes)

        def ref(r: Ref) -> TensorRef | Slot:
            return Slot(r) if isinstance(r, int) else TensorRef(m.inputs[r])

        return node, [(c.aten, c.args(ref)) for c in seq], ref(root)

    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        plan = self._plan(g, site)
        return plan if isinstance(plan, str) else why_not_substitute(g, order, *plan)

    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        plan = self._plan(g, site)
        if isinstance(plan, str):
            raise RuleError(plan)
        return substitute(g, order, *plan, label=self.kind)
