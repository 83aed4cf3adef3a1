"""What a rule is: the protocols every registered rule implements (docs/rules.md: how to add one).

Three families, by what a rule edits:
- RegionRule: the F-Tree, i.e. which regions run in parts (fission). The search expands the
  base with the new tree and replays the recipes.
- ProgramRule: the state's program at a site (a tensor, the node that makes it, the readers
  to redirect) outside every fission region (remat, swap). An application is kept as a
  recipe, replayed when the regions change and undone by replaying the others. Its hooks
  say where the nodes it adds go (schedule.placement) and what code they become
  (codegen.source).
- RewriteRule: the base graph (TASO-style rewrites); the F-Tree is updated after it. All
  rewrite rules share one move kind, REWRITE_MOVES, and one list of sites per base.

Every hook is a pure function of its arguments: rules hold no state.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Protocol

from peakcut.fission.ftree import FTree
from peakcut.ir.graph import Graph
from peakcut.ir.node import Node
from peakcut.rules.hotspot import Hotspot, HotspotSite
from peakcut.schedule.placement import Placement
from peakcut.transform.rewrite import Rewrite, compose_rewrites
from peakcut.transform.taso.find import TasoCandidate

REWRITE_MOVES = "taso"   # the search's move kind of every RewriteRule (MoveSettings, Deriver timing)

LoopRefusal = Callable[[Sequence[int]], str | None]
"""Why a fission region with these nodes cannot be emitted as a loop (None: it can)."""


class Site(Protocol):
    """Where a program rule applies: a tensor, the node that makes it, the readers it redirects
    (a HotspotSite, a registry Candidate and an optimizer Recipe all are sites)."""

    @property
    def tensor(self) -> int: ...

    @property
    def node(self) -> int: ...

    @property
    def users(self) -> tuple[int, ...]: ...


class Names(Protocol):
    """What rule code needs from the source generator's naming (codegen.source)."""

    by_tensor: dict[int, str]

    def fresh(self, text: str) -> str: ...


class NodeCode(Protocol):
    """What a program rule writes into the generated step for the nodes it added, for one
    program (made by ProgramRule.code).

    Subclass it to inherit the defaults (nothing extra anywhere) and write only the hooks a
    rule needs."""

    def signature_extra(self) -> str:
        """Keyword parameters the step takes for this rule's code (e.g. ', host'), or ''."""
        return ""

    def prologue(self) -> list[str]:
        """Lines at the top of the step's body."""
        return []

    def keeps(self, tensor: int) -> bool:
        """True when the step must not `del` this tensor at its last use (this code does)."""
        return False

    def before(self, nid: int, pad: str) -> list[str]:
        """Lines right before node nid's own lines (pad: the indentation at that point)."""
        return []

    def emit(self, node: Node) -> list[str] | None:
        """The node's own lines when this rule writes them, else None (an ordinary ATen call)."""
        return None

    def epilogue(self) -> list[str]:
        """Lines at the end of the step's body, before it returns."""
        return []


class ProgramRule(Protocol):
    """A rule applied to the state's program at a site, kept as a recipe (see module doc).

    Subclass it to inherit the defaults of the placement and code hooks (none)."""

    frees_by_host_copy: bool = False
    """True when the rule saves device memory by keeping tensors in host memory: it saves
    nothing where the device is the host (a CPU), and the search leaves it out there."""

    batched: bool = False
    """True when the rule's sites are independent of each other (each its own parameter's or
    input's tensors) and apply_many applies many in one edit: the search then also offers all
    of its sites at once as one move, and replays runs of its recipes in one edit."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def kind(self) -> str:
        """Unique name: a recipe's kind, a move's kind and its MoveSettings switch."""
        ...

    @property
    def reserved_names(self) -> tuple[str, ...]:
        """Identifiers this rule's generated code uses: never given to a tensor of any program."""
        return ()

    def sites(self, spot: Hotspot) -> Iterable[HotspotSite]:
        """Where to try the rule on spot's program, best first (why_not filters them)."""
        ...

    def why_not(self, g: Graph, order: Sequence[int], site: Site) -> str | None:
        """Why the rule does not apply at `site` of (g, order); None when it does."""
        ...

    def apply(self, g: Graph, order: Sequence[int], site: Site) -> Rewrite:
        """The rule applied at `site`; raises transform.RuleError where it does not apply."""
        ...

    def describe(self, g: Graph, site: Site) -> str:
        """One line for the search's report: what applying at `site` of g does."""
        ...

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
        """(node, where it goes in the order) for every node of g this rule added."""
        return ()

    def loop_refusal(self, g: Graph) -> LoopRefusal | None:
        """Why fission regions holding this rule's code in g cannot be loops (None: no refusal)."""
        return None

    def code(self, g: Graph, order: Sequence[int], names: Names) -> NodeCode | None:
        """The code of this rule's nodes in program (g, order); None when g has none."""
        return None


class RewriteRule(Protocol):
    """A rewrite of the base graph (see module doc)."""

    in_regions: bool = False
    """True when the rule may rewrite nodes of enabled fission regions: the F-Tree is then found
    again on the new base and the enabled regions carried over (Deriver.with_taso). Others apply
    outside every enabled region only."""

    on_root: bool = False
    """True when the rule's first site is also tried on the search's root before the search, and
    kept there where it lowers the simulated peak without raising the simulated latency
    (optimizer.root_rewrites): a rewrite that usually costs nothing, which a short search might
    otherwise never combine with the moves it takes."""

    @property
    def kind(self) -> str:
        """Unique name (TasoCandidate.kind of its sites)."""
        ...

    def sites(self, g: Graph, order: Sequence[int]) -> Iterator[TasoCandidate]:
        """The sites where the rule applies, lazily, in a deterministic order. The caller has
        checked that `order` is an order of g (Registry.rewrite_candidates)."""
        ...

    def why_not(self, g: Graph, order: Sequence[int], site: TasoCandidate) -> str | None:
        """Why the rule does not apply at `site` of (g, order); None when it does."""
        ...

    def apply(self, g: Graph, order: Sequence[int], site: TasoCandidate) -> Rewrite:
        """The rule applied at `site`; raises transform.RuleError (or ValueError) where it
        does not apply."""
        ...

    def describe(self, site: TasoCandidate) -> str:
        """One line for the search's report."""
        ...

    def at_peak(self, g: Graph, order: Sequence[int], nid: int) -> TasoCandidate | None:
        """A site at node `nid` of (g, order), where a plan peaks, for the polish after the search
        (optimizer.polish); None where the rule has none there (the default: the rule takes no
        part in the polish)."""
        return None


class RegionRule(Protocol):
    """A change of the F-Tree: which regions run in parts (see module doc)."""

    @property
    def kind(self) -> str:
        """Unique name: a move's kind and its MoveSettings switch."""
        ...

    def mutations(self, tree: FTree, direct_enable: bool) -> list[tuple[str, int]]:
        """The changes that apply to `tree`, as (what, F-Tree node id)."""
        ...

    def apply(self, tree: FTree, mutation: tuple[str, int]) -> FTree:
        """`tree` after `mutation` (one of mutations(tree, ...))."""
        ...

    def describe(self, tree: FTree, mutation: tuple[str, int], new: FTree) -> str:
        """One line for the search's report: `mutation` turned `tree` into `new`."""
        ...


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
    what = rule.describe(g, sites[reasons.index(None)]) if len(chosen) == 1 else plural.format(n=len(chosen))
    return edit(g, order, chosen, what), reasons
