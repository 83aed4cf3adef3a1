"""The phases a rewrite rule runs in (RewriteRule.phases): when the optimizer asks the rule for
sites, and on what.

A Phase runs before the search (on its root), during it (as the search's moves) or after it
(on its best plan). The optimizer runs every phase some registered rule declares, with no list
of phases of its own (peakcut.optimizer.root_rewrites runs those before the search,
peakcut.optimizer.polish those after it), so a rule adds a phase by declaring a new Phase:

- before: each rule's first site (RewriteRule.sites, Query.phase the phase) on the root's
  base, in registry order; the rewritten root replaces the root where it dominates it;
- during: the registry interleaves the rules' sites on each state's base (Registry.
  rewrite_candidates); `inside_regions` lets a rule rewrite nodes of enabled fission regions;
- after: at the node where the best plan peaks (Query.peak), the first site of the rules in
  registry order, applied to the plan's program while the objective prefers it.

The built-in phases: ROOT (before), SEARCH and REGIONS (during), POLISH (after).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, Protocol

When = Literal["before", "during", "after"]


@dataclass(frozen=True)
class Phase:
    """A phase of the optimizer (module doc): its name, when it runs, and for a phase during
    the search whether its rules may rewrite nodes of enabled fission regions."""

    name: str
    when: When
    inside_regions: bool = False


ROOT = Phase("root", "before")
"""The first site tried on the search's root, kept where it dominates: a rewrite that usually
costs nothing, which a short search might otherwise never combine with the moves it takes."""

SEARCH = Phase("search", "during")
"""The search's moves, outside every enabled fission region (every rule's default)."""

REGIONS = Phase("regions", "during", inside_regions=True)
"""The search's moves, inside enabled fission regions too: the F-Tree is found again on the
new base and the enabled regions carried over (optimizer.derive)."""

POLISH = Phase("polish", "after")
"""Where the best plan peaks, after the search (optimizer.polish)."""


class Phased(Protocol):
    """What the helpers below read of a rule."""

    @property
    def phases(self) -> frozenset[Phase]: ...


def declared(rules: Iterable[Phased], when: When) -> tuple[Phase, ...]:
    """The phases that run `when`, of every rule, in the order the rules declare them (a rule's
    own phases by name)."""
    out: dict[Phase, None] = {}
    for rule in rules:
        for phase in sorted(rule.phases, key=lambda p: p.name):
            if phase.when == when:
                out.setdefault(phase)
    return tuple(out)


def in_search(rule: Phased) -> bool:
    """The rule's sites are the search's moves (a phase during the search)."""
    return any(p.when == "during" for p in rule.phases)


def inside_regions(rule: Phased) -> bool:
    """The rule may rewrite nodes of enabled fission regions."""
    return any(p.inside_regions for p in rule.phases)
