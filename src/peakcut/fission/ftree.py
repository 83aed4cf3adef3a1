"""The fission hierarchy tree (F-Tree, MAGIS §4.3, §5.1) as an explicit, immutable structure.

Each tree node records one F-Trans f = (S, D, n): a set of graph nodes S, the
D-Graph component D it is split along (per graph node: the axis label that
carries D, and the length of D), and the fission number n (1 = disabled, a
fission candidate; n > 1 = enabled, S runs in n parts). A child's S is a
subset of its parent's.

Mutation rules (§5.1), each a pure function FTree -> FTree with a why_not_*
twin that says why it does not apply:

- enable: a disabled leaf, or the disabled parent of an enabled node when it
  has no enabled ancestor, gets n = the smallest divisor > 1 of D's length;
- lift: an enabled node without enabled ancestors is disabled and its parent
  enabled (at the same n if it divides, else the smallest divisor);
- disable: an enabled node without enabled descendants gets n = 1;
- mutate: an enabled node's n goes to the next divisor of D's length.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace


class FTreeError(ValueError):
    """A mutation rule was applied where it does not apply (the message says why)."""


@dataclass(frozen=True)
class FNode:
    """One F-Trans candidate: S (graph node ids), D (per node its axis label, and the length), n."""

    id: int
    nodes: frozenset[int]
    labels: Mapping[int, str]       # graph node id -> the axis label of D at that node
    length: int                     # length of D's dimension (n must divide it)
    component: int                  # id of D in the D-Graph
    dominator: int                  # the graph node whose dominated region this is
    score: float                    # Eq. 4 score at n = 2 (bytes)
    heat: int                       # Eq. 3 heat (bytes)
    level: int                      # score interval index i of Algorithm 1 (1..L)
    parent: int | None = None
    n: int = 1

    @property
    def enabled(self) -> bool:
        return self.n > 1


def divisors(length: int) -> list[int]:
    """Divisors of `length` above 1, ascending (pairs up to its square root: a graph's
    231M-edge dimension takes milliseconds)."""
    low = [d for d in range(1, math.isqrt(length) + 1) if length % d == 0] if length > 0 else []
    both = set(low) | {length // d for d in low}
    return sorted(d for d in both if d > 1)


@dataclass(frozen=True)
class FTree:
    """A forest of FNodes (several D-Graph components give several roots)."""

    nodes: tuple[FNode, ...]

    # ------------------------------------------------------------ structure
    def node(self, k: int) -> FNode:
        if not 0 <= k < len(self.nodes):
            raise FTreeError(f"F-Tree has no node {k} (it has {len(self.nodes)})")
        return self.nodes[k]

    def children(self, k: int) -> list[int]:
        return [f.id for f in self.nodes if f.parent == k]

    def ancestors(self, k: int) -> Iterator[int]:
        p = self.node(k).parent
        while p is not None:
            yield p
            p = self.nodes[p].parent

    def descendants(self, k: int) -> Iterator[int]:
        for c in self.children(k):
            yield c
            yield from self.descendants(c)

    def roots(self) -> list[int]:
        return [f.id for f in self.nodes if f.parent is None]

    def depth(self, k: int) -> int:
        return sum(1 for _ in self.ancestors(k))

    def levels(self) -> int:
        """Number of levels (longest root-to-leaf path, in nodes)."""
        return max((self.depth(f.id) + 1 for f in self.nodes), default=0)

    def nodes_per_level(self) -> list[int]:
        counts = [0] * self.levels()
        for f in self.nodes:
            counts[self.depth(f.id)] += 1
        return counts

    def enabled(self) -> list[FNode]:
        return [f for f in self.nodes if f.enabled]

    def with_n(self, k: int, n: int) -> FTree:
        """This tree with node k at fission number n, bypassing the rules (analysis, reports, tests)."""
        f = self.node(k)
        if n < 1 or f.length % n:
            raise FTreeError(f"F-Tree node {k}: n = {n} does not divide its dimension length {f.length}")
        return self._with(k, n)

    def _with(self, k: int, n: int) -> FTree:
        nodes = list(self.nodes)
        nodes[k] = replace(nodes[k], n=n)
        return FTree(tuple(nodes))

    # ------------------------------------------------------------ rules
    def why_not_enable(self, k: int) -> str | None:
        f = self.node(k)
        if f.enabled:
            return f"F-Tree node {k} is already enabled (n = {f.n})"
        if not divisors(f.length):
            return f"F-Tree node {k}: dimension length {f.length} has no divisor above 1"
        children = self.children(k)
        if not children:
            return None
        if not any(self.nodes[c].enabled for c in children):
            return f"F-Tree node {k} is not a leaf and none of its children is enabled"
        if any(self.nodes[a].enabled for a in self.ancestors(k)):
            return f"F-Tree node {k} has an enabled ancestor"
        return None

    def enable(self, k: int) -> FTree:
        reason = self.why_not_enable(k)
        if reason:
            raise FTreeError(reason)
        return self._with(k, divisors(self.nodes[k].length)[0])

    def why_not_lift(self, k: int) -> str | None:
        f = self.node(k)
        if not f.enabled:
            return f"F-Tree node {k} is not enabled"
        if f.parent is None:
            return f"F-Tree node {k} is a root: there is no parent to lift to"
        if any(self.nodes[a].enabled for a in self.ancestors(k)):
            return f"F-Tree node {k} has an enabled ancestor"
        return None

    def lift(self, k: int) -> FTree:
        reason = self.why_not_lift(k)
        if reason:
            raise FTreeError(reason)
        f = self.nodes[k]
        parent = self.nodes[f.parent]  # type: ignore[index]
        n = f.n if parent.length % f.n == 0 else divisors(parent.length)[0]
        return self._with(k, 1)._with(parent.id, n)

    def why_not_disable(self, k: int) -> str | None:
        f = self.node(k)
        if not f.enabled:
            return f"F-Tree node {k} is not enabled"
        if any(self.nodes[d].enabled for d in self.descendants(k)):
            return f"F-Tree node {k} has an enabled descendant"
        return None

    def disable(self, k: int) -> FTree:
        reason = self.why_not_disable(k)
        if reason:
            raise FTreeError(reason)
        return self._with(k, 1)

    def why_not_mutate(self, k: int) -> str | None:
        f = self.node(k)
        if not f.enabled:
            return f"F-Tree node {k} is not enabled"
        if not [d for d in divisors(f.length) if d > f.n]:
            return f"F-Tree node {k}: n = {f.n} is already the largest divisor of {f.length}"
        return None

    def mutate(self, k: int) -> FTree:
        reason = self.why_not_mutate(k)
        if reason:
            raise FTreeError(reason)
        f = self.nodes[k]
        return self._with(k, next(d for d in divisors(f.length) if d > f.n))

    def mutations(self) -> list[tuple[str, int]]:
        """Every (rule, node) that applies now."""
        out = []
        for f in self.nodes:
            for rule, why_not in (("enable", self.why_not_enable), ("lift", self.why_not_lift),
                                  ("disable", self.why_not_disable), ("mutate", self.why_not_mutate)):
                if why_not(f.id) is None:
                    out.append((rule, f.id))
        return out

    def apply(self, rule: str, k: int) -> FTree:
        rules = {"enable": self.enable, "lift": self.lift, "disable": self.disable, "mutate": self.mutate}
        if rule not in rules:
            raise FTreeError(f"unknown F-Tree rule {rule!r}; known: {sorted(rules)}")
        return rules[rule](k)

    def summary(self) -> dict:
        return {"levels": self.levels(), "nodes_per_level": self.nodes_per_level(),
                "nodes": len(self.nodes), "enabled": [(f.id, f.n) for f in self.enabled()]}
