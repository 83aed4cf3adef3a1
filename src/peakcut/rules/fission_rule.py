"""The fission rule in the registry: F-Tree mutations (MAGIS §5.1) that change which regions of
the base run in parts (the expansion itself: peakcut.fission.expand; the loops in generated
code: peakcut.codegen.fission)."""

from __future__ import annotations

from peakcut.fission.ftree import FTree, divisors
from peakcut.rules.base import Mutation, RegionRule
from peakcut.rules.query import Query

ENABLE_ANY = "enable-any"   # the mutation that enables a root directly (FissionRule.sites)
DIRECT_PARTS = 3            # a root is enabled directly at each of its first this many divisors


class FissionRule(RegionRule):
    """Enable, lift, disable and mutate F-Tree nodes (FTree.mutations), plus enabling a root
    without enabled descendants directly (Query.direct_enable)."""

    kind = "fission"

    def sites(self, query: Query) -> list[Mutation]:
        """The F-Tree mutations of §5.1, plus (beyond the paper) enabling a root whose
        descendants are all disabled: the root at n = 2 in one step instead of a leaf lifted
        level by level through states that each must look good enough to be expanded, and at
        n = 4 and 8 too (its first DIRECT_PARTS divisors), instead of n doubled state by state:
        on a GPU a whole step in 8 parts can cost under 10% (its calls stay large enough to
        keep the device busy), and GPT-Neo-1.3B's 60 s search builds 28 states."""
        tree = query.tree
        rules = tree.mutations()
        if query.direct_enable:
            plain = {k for rule, k in rules if rule == "enable"}
            for k in tree.roots():
                f = tree.nodes[k]
                if (not f.enabled and divisors(f.length)
                        and not any(tree.nodes[d].enabled for d in tree.descendants(k))):
                    parts = divisors(f.length)[:DIRECT_PARTS]
                    rules += [(f"{ENABLE_ANY}@{n}", k) for n in parts[1:]]
                    if k not in plain:
                        rules.append((ENABLE_ANY, k))
        return rules

    def apply(self, tree: FTree, site: Mutation) -> FTree:
        rule, k = site
        if rule == ENABLE_ANY:
            return tree.with_n(k, divisors(tree.nodes[k].length)[0])
        if rule.startswith(f"{ENABLE_ANY}@"):
            return tree.with_n(k, int(rule.partition("@")[2]))
        return tree.apply(rule, k)

    def describe(self, query: Query, site: Mutation) -> str:
        rule, k = site
        new = self.apply(query.tree, site)
        f = new.nodes[k]
        what = f"fission: {rule} F-Tree node {k} ({len(f.nodes)} ops) -> n = {f.n}"
        if rule == "lift" and f.parent is not None:
            what += f", parent {f.parent} at n = {new.nodes[f.parent].n}"
        return what
