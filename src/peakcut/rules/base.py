"""What a rule is: one abstract base class per family, all three a Rule (docs/rules.md: how to
add one).

Three families, by what a rule edits:
- RegionRule: the F-Tree, i.e. which regions run in parts (fission). The search expands the
  base with the new tree and replays the recipes.
- ProgramRule: the state's program at a site (a tensor, the node that makes it, the readers
  to redirect) outside every fission region (remat, swap). An application is kept as a
  recipe, replayed when the regions change and undone by replaying the others. Its hook
  says where the nodes it adds go (schedule.placement).
- RewriteRule: the base graph (TASO-style rewrites, checkpointing, splits); the F-Tree is
  updated after it. A rule declares the phases it runs in (peakcut.rules.phase). All
  rewrite rules share one move kind, REWRITE_MOVES, and one list of sites per base.

Every family finds its sites with `sites(query)` and words a site with `describe(query,
site)` (peakcut.rules.query.Query: the program and what the caller knows of it). A rule
writes the abstract methods; the others are options with defaults. Every hook is a pure
function of its arguments: rules hold no state.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, Protocol, TypeVar

from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.rules.hotspot import HotspotSite
from peakcut.rules.phase import SEARCH, Phase
from peakcut.rules.query import Query
from peakcut.schedule.placement import Placement
from peakcut.transform.rewrite import Rewrite, compose_rewrites
from peakcut.transform.site import RewriteSite

REWRITE_MOVES = "taso"   # the search's move kind of every RewriteRule (MoveSettings, Deriver timing)

Mutation = tuple[str, int]
"""A region rule's site: what it changes (an F-Tree rule such as "enable") and the F-Tree node."""

SiteT = TypeVar("SiteT")
"""A family's site type: Mutation, Site (program rules) or RewriteSite."""


class Rule(ABC, Generic[SiteT]):
    """What every rule is, whatever its family: a unique kind, the sites it finds for a query,
    and a line for the report about one of them."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    @abstractmethod
    def kind(self) -> str:
        """Unique name across the registry: a move's kind and its MoveSettings switch (a
        recipe's kind for program rules, RewriteSite.kind for rewrite rules)."""

    @abstractmethod
    def sites(self, query: Query) -> Iterable[SiteT]:
        """Where the rule may apply on what `query` holds (each family's doc says what it reads)."""

    @abstractmethod
    def describe(self, query: Query, site: SiteT) -> str:
        """One line for the search's report: what applying at `site` does."""


class RegionRule(Rule[Mutation]):
    """A change of the F-Tree: which regions run in parts (see module doc). Its sites are the
    changes that apply to query.tree."""

    @abstractmethod
    def apply(self, tree: FTree, site: Mutation) -> FTree:
        """`tree` after `site` (one of sites(...) of a query of this tree)."""


class Site(Protocol):
    """Where a program rule applies: a tensor, the node that makes it, the readers it redirects
    (a HotspotSite, a registry Candidate and an optimizer Recipe all are sites)."""

    @property
    def tensor(self) -> int: ...

    @property
    def node(self) -> int: ...

    @property
    def users(self) -> tuple[int, ...]: ...


class ProgramRule(Rule[Site]):
    """A rule applied to the state's program at a site, kept as a recipe (see module doc)."""

    frees_by_host_copy: bool = False
    """True when the rule saves device memory by keeping tensors in host memory: it saves
    nothing where the device is the host (a CPU), and the search leaves it out there."""

    batched: bool = False
    """True when the rule's sites are independent of each other (each its own parameter's or
    input's tensors) and apply_many applies many in one edit: the search then also offers all
    of its sites at once as one move, and replays runs of its recipes in one edit."""

    at_root: bool = False
    """True when a batched rule's move at every one of its sites is also tried on the search's
    root, and kept where it dominates or the objective prefers it
    (peakcut.optimizer.root_rewrites): a move the search would take first, which a short
    search of a large step might otherwise never combine with the moves it takes."""

    @abstractmethod
    def sites(self, query: Query) -> Iterable[HotspotSite]:
        """Where to try the rule on query's program (query.hotspot: its memory hot-spot), best
        first (why_not filters them)."""

    @abstractmethod
    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        """Why the rule does not apply at `site` of (g, order); None when it does."""

    @abstractmethod
    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        """The rule applied at `site`; raises transform.RuleError where it does not apply."""

    def apply_many(self, g: Graph, order: Sequence[int], sites: Sequence[Site]
                   ) -> tuple[Rewrite | None, list[str | None]]:
        """The rule at every site where it applies: the rewrite (None when no site applies)
        and, per site, why it does not apply (None: applied). A `batched` rule does it in one
        edit; this default applies the sites one at a time, each judged after the others."""
        reasons: list[str | None] = []
        steps: list[Rewrite] = []
        for site in sites:
            h, o = (g, order) if not steps else (steps[-1].graph, steps[-1].order)
            reason = self.why_not(h, o, site)
            reasons.append(reason)
            if reason is None:
                steps.append(self.apply(h, o, site))
        if not steps:
            return None, reasons
        return compose_rewrites(g, steps, f"{self.kind} at {len(steps)} sites"), reasons

    def placements(self, g: Graph) -> Iterable[tuple[int, Placement]]:
        """(node, where it goes in the order) for every node of g this rule added (default:
        none; the scheduler places them as any node)."""
        return ()


class RewriteRule(Rule[RewriteSite]):
    """A rewrite of the base graph (see module doc)."""

    phases: frozenset[Phase] = frozenset({SEARCH})
    """The phases the rule runs in (peakcut.rules.phase): by default the search's moves,
    outside every enabled fission region."""

    @abstractmethod
    def sites(self, query: Query) -> Iterator[RewriteSite]:
        """The sites where the rule applies on (query.g, query.order), lazily, in a
        deterministic order, for query.phase: in a phase after the search, the sites at node
        query.peak (none where the rule has none there). During the search the caller has
        checked that the order is an order of the graph (Registry.rewrite_candidates)."""

    @abstractmethod
    def why_not(self, g: Graph, order: Sequence[int], site: RewriteSite) -> str | None:
        """Why the rule does not apply at `site` of (g, order); None when it does."""

    @abstractmethod
    def apply(self, g: Graph, order: Sequence[int], site: RewriteSite) -> Rewrite:
        """The rule applied at `site`; raises transform.RuleError (or ValueError) where it
        does not apply."""


def apply_in_one_edit(rule: ProgramRule, g: Graph, order: Sequence[int], sites: Sequence[Site],
                      edit: Callable[[Graph, Sequence[int], list[int], str], Rewrite], plural: str
                      ) -> tuple[Rewrite | None, list[str | None]]:
    """A batched rule's apply_many when its sites touch disjoint storages: the tensors of
    `sites` where `rule` applies (each once) go to edit(g, order, tensors, what) together; `what`
    is the one site's description, or `plural` with {n} the count. Also per site, why it does
    not apply (None: it does)."""
    reasons: list[str | None] = []
    chosen: list[int] = []
    seen: set[int] = set()
    for site in sites:
        reason = rule.why_not(g, order, site) if site.tensor not in seen else "the same tensor twice"
        reasons.append(reason)
        if reason is None:
            chosen.append(site.tensor)
            seen.add(site.tensor)
    if not chosen:
        return None, reasons
    first = sites[reasons.index(None)]
    what = rule.describe(Query(g, order), first) if len(chosen) == 1 else plural.format(n=len(chosen))
    return edit(g, order, chosen, what), reasons
