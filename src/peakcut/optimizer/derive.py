"""Deriving a child State from its parent: fission, program-rule recipes, scheduling, simulation.

The rules come from a registry (peakcut.rules: Deriver.rules, RULES by default).
- fission changes (a new F-Tree) re-expand the base and replay the recipes that still
  apply outside the enabled regions;
- a new recipe (a program rule at a site: remat, swap, ...) is applied to the parent's
  program directly (its nodes are outside every enabled region, where the program keeps the
  base's ids), then the affected interval is rescheduled (Algorithm 2; where that does not
  lower the peak, a wider one between true cuts) and the nodes the rules added are placed
  (schedule.place, RULES.placements);
- removing a recipe (de-remat, de-swap) replays the others from the expanded base;
- a TASO-style rewrite changes the base. Where it adds nothing (drops an identity,
  cancels transposes, folds views), touches no recipe, and touches a region's nodes only
  to make them read a tensor of the same layout and storage (rebase.py: outside, alike), it is
  applied to the parent's program directly (the same edit the base takes) and the state
  is "pending": base, F-Tree and D-Graph stay the parent's until `resolve`, which the
  search calls when it expands the state (MAGIS Algorithm 3 line 16: Analyze updates the
  F-Tree of the state taken from the queue). resolve rewrites the base, updates the F-Tree
  (the F-Tree update after a non-fission rewrite: kept as it is where the rewrite leaves
  every F-Tree node's dimension rules alone, rebase.kept_tree, else Algorithm 1 again) and
  carries the enabled nodes over; when they cover the same nodes with the same labels, ids
  and n, the program and figures stand, else the state is derived again on the new base (a
  new program, which the search judges as a new state). Elsewhere the eager way: the base
  is rewritten, the F-Tree updated, the enabled nodes carried, the base expanded and the
  recipes replayed. Either way the rewritten base and its F-Tree are made once per (base,
  site) and shared.
- expansions of one base that start with the same regions share them
  (peakcut.fission.reuse: snapshots after each region, the same result as without); a
  base rewritten with its F-Tree kept is linked to the old one, whose snapshots it may
  start from, edited alike (an equivalent program).
Every derived program is simulated on the device cost model (timeline: compute and
copy streams), which gives the state's peak and latency.

With `compact` (the default), a state with enabled regions holds the compact expansion
(part 0 of each region, peakcut.fission.expand(compact=True)) priced by RepeatedCost: the
same peak and, without copies around a region, the same latency as the full expansion, at a
fraction of the nodes. `exact(state)` re-derives such a state on the full expansion: the
program that runs, and the figures reported.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from peakcut.cost.protocol import CostModel
from peakcut.fission.analyzer import DEFAULT_LEVELS
from peakcut.fission.dgraph import DGraph
from peakcut.fission.expand import expand
from peakcut.fission.expanded import FissionError
from peakcut.fission.ftree import FTree
from peakcut.fission.reuse import ExpansionCache
from peakcut.ir.graph import Graph, GraphError
from peakcut.ir.tags import RematTag
from peakcut.memory import simulate
from peakcut.memory.workspace import WorkspaceSpec, workspace_model
from peakcut.optimizer.compact import RepeatedCost
from peakcut.optimizer.rebase import Rebased, alike, carry_enabled, outside, rebase, same_regions
from peakcut.optimizer.state import PendingRebase, Recipe, State, computation_hash
from peakcut.optimizer.timing import DeriveTimes
from peakcut.rules import RULES, Registry
from peakcut.rules.phase import inside_regions
from peakcut.rules.query import Query
from peakcut.schedule import Problem, Reachability, incremental_schedule, place
from peakcut.schedule.incremental import CUTS, IntervalRule, reschedule_interval
from peakcut.schedule.placement import Placement
from peakcut.simulate import simulate_timeline
from peakcut.transform import Rewrite, RuleError
from peakcut.transform.site import RewriteSite

RESCHEDULE_SECONDS = 0.3   # cap on one incremental reschedule (a fallback to a full one included)
REBASED_KEPT = 16          # rewritten bases kept for reuse (each holds a graph, F-Tree and D-Graph)


class DeriveError(ValueError):
    """A child state could not be built (the message says which rule and why)."""


@dataclass
class Deriver(DeriveTimes):
    """What every derivation needs: the cost model, the rules, how F-Trees are built; and, as
    a DeriveTimes, how long derivations took."""

    cost: CostModel
    workspace: WorkspaceSpec = "auto"
    reschedule: bool = True
    levels: int = DEFAULT_LEVELS
    batch_only: bool = True
    compact: bool = True
    memo: dict[tuple, list] = field(default_factory=dict)   # expand's FakeTensor-run memo
    taso_sites: dict[str, list[RewriteSite]] = field(default_factory=dict)   # base digest -> sites
    rewritten: dict[tuple[str, RewriteSite], Rebased] = field(default_factory=dict)   # see rebased
    expansions: ExpansionCache = field(default_factory=ExpansionCache)    # see expanded
    lazy_taso: bool = True     # TASO-style rewrites on the program where they can (see module doc)
    rules: Registry = RULES

    def __post_init__(self) -> None:
        # the workspace model is resolved once, here: every simulation reuses it, and forked
        # search workers (which run torch on one thread) model this process's machine
        self.workspace = workspace_model(self.workspace)

    # ------------------------------------------------------------ building blocks
    def finish(self, base: Graph, base_order: list[int], tree: FTree, dgraph: DGraph,
               recipes: tuple[Recipe, ...], program: Graph, order: list[int], applied: tuple[str, ...],
               depth: int, compact: bool | None = None, *, base_digest: str,
               rewrites: tuple[str, ...], placements: dict[int, Placement] | None = None) -> State:
        """Place the nodes the recipes added, simulate, hash (a compact program priced per part).
        base_digest: computation hash of `base` ("" when not known); rewrites: the rewrites
        that made `base` from the capture, oldest first; placements: the rules' placements of
        `program`'s nodes, where the caller has them (RULES.placements)."""
        compact = self.compact if compact is None else compact
        cost = RepeatedCost(self.cost, tree) if compact and tree.enabled() else self.cost
        if recipes:
            if placements is None:
                placements = self.rules.placements(program)
            order = place(program, order, cost, placements=placements)
        t0 = time.perf_counter()
        tl = simulate_timeline(program, order, cost, self.workspace)
        state = State(base, base_order, tree, dgraph, recipes, program, order, tl.peak_bytes,
                      tl.latency_seconds, applied, computation_hash(program, order), depth, base_digest,
                      rewrites=rewrites)
        state.compact = cost is not self.cost
        self.record_per_node("finish", (time.perf_counter() - t0) / max(1, len(program.nodes)))
        return state

    def expanded(self, base: Graph, base_order: list[int], tree: FTree,
                 dgraph: DGraph, compact: bool | None = None) -> tuple[Graph, list[int]]:
        if not tree.enabled():
            return base, list(base_order)
        compact = self.compact if compact is None else compact
        try:
            ex = expand(base, base_order, tree, dgraph, check=False, compact=compact, memo=self.memo,
                        reuse=self.expansions)
        except (FissionError, GraphError) as e:
            raise DeriveError(f"fission {[(f.id, f.n) for f in tree.enabled()]}: {e}") from None
        return ex.graph, list(ex.order)

    def exact(self, state: State) -> State:
        """`state` on the full expansion of its regions (itself when it is not compact): the
        program that runs, with its simulated peak and latency. A pending state is resolved
        first."""
        state = self.resolve(state)
        if not state.compact:
            return state
        t0 = time.perf_counter()
        program, order = self.expanded(state.base, state.base_order, state.tree, state.dgraph, compact=False)
        program, order, kept, dropped = self.replay(program, order, state.recipes, region_nodes(state.tree))
        exact = self.finish(state.base, state.base_order, state.tree, state.dgraph, kept, program, order,
                            (*state.applied, *dropped), state.depth, compact=False,
                            base_digest=state.base_digest, rewrites=state.rewrites)
        exact.compact_estimate = (state.peak_bytes, state.latency_s)
        self.record("exact", t0)
        self.record_per_node("exact", self.seconds["exact"][-1] / len(program.nodes))
        return exact

    def replay(self, program: Graph, order: list[int], recipes: Iterable[Recipe],
               regions: frozenset[int]) -> tuple[Graph, list[int], tuple[Recipe, ...], list[str]]:
        """Apply the recipes that still apply; returns the kept ones and why others were dropped.
        A run of recipes of one batched rule (ProgramRule.batched) is applied in one edit."""
        kept: list[Recipe] = []
        dropped: list[str] = []
        for kind, run in itertools.groupby(recipes, key=lambda r: r.kind):
            group = list(run)
            rule = self.rules.program_rule(kind)
            if rule.batched and len(group) > 1:
                fit = []
                for r in group:
                    reason = self._why_not_here(program, r, regions)
                    if reason is None:
                        fit.append(r)
                    else:
                        dropped.append(f"{r.description} no longer applies: {reason}")
                rw, reasons = rule.apply_many(program, order, fit) if fit else (None, [])
                for r, reason in zip(fit, reasons, strict=True):
                    if reason is None:
                        kept.append(r)
                    else:
                        dropped.append(f"{r.description} no longer applies: {reason}")
                if rw is not None:
                    program, order = rw.graph, rw.order
                continue
            for r in group:
                reason = self.why_not_recipe(program, order, r, regions)
                if reason is not None:
                    dropped.append(f"{r.description} no longer applies: {reason}")
                    continue
                rw = self.apply_recipe(program, order, r)
                program, order = rw.graph, rw.order
                kept.append(r)
        return program, order, tuple(kept), dropped

    def why_not_recipe(self, program: Graph, order: list[int], r: Recipe,
                       regions: frozenset[int]) -> str | None:
        """Why recipe r does not apply to (program, order) with these region nodes (None: it does)."""
        reason = self._why_not_here(program, r, regions)
        if reason is not None:
            return reason
        return self.rules.program_rule(r.kind).why_not(program, order, resolved(program, r))

    @staticmethod
    def _why_not_here(program: Graph, r: Recipe, regions: frozenset[int]) -> str | None:
        """Why recipe r cannot apply to `program` whatever its rule says: it would cross a
        region's boundary, or what it names is gone."""
        touched = (r.node, *r.users, *r.copies_of)
        inside = [v for v in touched if v in regions]
        if inside:
            return f"it would cross the boundary of an enabled fission region (node {inside[0]})"
        missing = [v for v in touched if v not in program.nodes]
        if missing or r.tensor not in program.tensors:
            return "a node or tensor it names is gone"
        if r.copies_of and set(r.copies_of) - {recomputed(program, u) for u in _copies(program, r)}:
            return "a recompute it names is gone"
        return None

    def apply_recipe(self, program: Graph, order: list[int], r: Recipe) -> Rewrite:
        """Recipe r applied to (program, order); DeriveError where its rule refuses."""
        try:
            return self.rules.program_rule(r.kind).apply(program, order, resolved(program, r))
        except RuleError as e:
            raise DeriveError(f"{r.description}: {e}") from None

    # ------------------------------------------------------------ the child kinds
    def with_tree(self, parent: State, tree: FTree, what: str) -> State:
        t0 = time.perf_counter()
        program, order = self.expanded(parent.base, parent.base_order, tree, parent.dgraph)
        regions = region_nodes(tree)
        program, order, kept, dropped = self.replay(program, order, parent.recipes, regions)
        state = self.finish(parent.base, parent.base_order, tree, parent.dgraph, kept, program, order,
                            (*parent.applied, what, *dropped), parent.depth + 1,
                            base_digest=parent.base_digest, rewrites=parent.rewrites)
        self.record("fission", t0)
        return state

    def with_recipe(self, parent: State, recipe: Recipe) -> State:
        t0 = time.perf_counter()
        reason = self.why_not_recipe(parent.program, parent.order, recipe, region_nodes(parent.tree))
        if reason is not None:
            raise DeriveError(f"{recipe.description}: {reason}")
        rw = self.apply_recipe(parent.program, parent.order, recipe)
        placements = self.rules.placements(rw.graph)      # once: the reschedule and the placing read it
        order = self.rescheduled(parent, rw, placements)
        state = self.finish(parent.base, parent.base_order, parent.tree, parent.dgraph,
                            (*parent.recipes, recipe),
                            rw.graph, order, (*parent.applied, recipe.description), parent.depth + 1,
                            base_digest=parent.base_digest, rewrites=parent.rewrites, placements=placements)
        self.record(recipe.kind, t0)
        return state

    def with_recipes(self, parent: State, recipes: tuple[Recipe, ...]) -> State:
        """Several recipes at once (each must still apply after the ones before it)."""
        t0 = time.perf_counter()
        program, order, kept, dropped = self.replay(parent.program, parent.order, recipes,
                                                    region_nodes(parent.tree))
        if not kept:
            raise DeriveError(f"none of {len(recipes)} recipes applies: {dropped[:1]}")
        state = self.finish(parent.base, parent.base_order, parent.tree, parent.dgraph,
                            (*parent.recipes, *kept),
                            program, order, (*parent.applied, *(r.description for r in kept)),
                            parent.depth + 1, base_digest=parent.base_digest, rewrites=parent.rewrites)
        self.record(recipes[0].kind, t0)
        return state

    def without_recipes(self, parent: State, recipes: tuple[Recipe, ...]) -> State:
        """`parent` without `recipes`: its regions expanded and its other recipes replayed."""
        t0 = time.perf_counter()
        program, order = self.expanded(parent.base, parent.base_order, parent.tree, parent.dgraph)
        gone = set(recipes)
        rest = tuple(r for r in parent.recipes if r not in gone)
        program, order, kept, dropped = self.replay(program, order, rest, region_nodes(parent.tree))
        undo = (f"undo: {recipes[0].description}" if len(recipes) == 1
                else f"undo: {recipes[0].kind} at {len(recipes)} sites")
        state = self.finish(parent.base, parent.base_order, parent.tree, parent.dgraph, kept, program, order,
                            (*parent.applied, undo, *dropped), parent.depth + 1,
                            base_digest=parent.base_digest, rewrites=parent.rewrites)
        self.record("undo", t0)
        return state

    def with_taso(self, parent: State, site: RewriteSite) -> State:
        """A TASO-style rewrite of the base: on the parent's program where it can (a pending
        state), else on the base, with the F-Tree rebuilt on it and the enabled nodes carried
        over to the new nodes that cover the same ops (see module doc)."""
        t0 = time.perf_counter()
        rule = self.rules.rewrite_rule(site.kind)
        inside = [] if inside_regions(rule) else [v for v in site.nodes if v in region_nodes(parent.tree)]
        if inside:
            raise DeriveError(f"{site.description}: inside an enabled fission region")
        state = self._taso_on_program(parent, site) if self.lazy_taso else None
        if state is None:
            new = self.rebased(parent.base_digest, parent.base, parent.base_order, site,
                               parent.tree, parent.dgraph)
            what = rule.describe(Query(parent.base, parent.base_order), site)
            state = self._on_rebased(new, parent.tree, parent.recipes, (*parent.applied, what),
                                     parent.depth + 1, (*parent.rewrites, what))
        self.record("taso", t0)
        return state

    def _taso_on_program(self, parent: State, site: RewriteSite) -> State | None:
        """The rewrite applied to the parent's program, when everything it touches is a base
        node outside every region and recipe (a pending state); None where it is not."""
        try:
            rw = self.rules.apply_rewrite(parent.program, parent.order, site)
        except (RuleError, ValueError):
            return None
        if not outside(parent, rw):
            return None
        what = self.rules.rewrite_rule(site.kind).describe(Query(parent.base, parent.base_order), site)
        state = self.finish(parent.base, parent.base_order, parent.tree, parent.dgraph, parent.recipes,
                            rw.graph, list(rw.order), (*parent.applied, what),
                            parent.depth + 1, base_digest=parent.base_digest,
                            rewrites=(*parent.rewrites, what))
        state.pending = PendingRebase(parent.base, tuple(parent.base_order), parent.base_digest, site)
        return state

    def _on_rebased(self, new: Rebased, tree: FTree, recipes: tuple[Recipe, ...],
                    applied: tuple[str, ...], depth: int, rewrites: tuple[str, ...]) -> State:
        """The state on a rewritten base (`rewrites` made it): `tree`'s enabled nodes carried
        over, the base expanded, the recipes replayed."""
        carried, lost = carry_enabled(tree, new.tree)
        base, base_order = new.base, list(new.order)
        program, order = self.expanded(base, base_order, carried, new.dgraph)
        program, order, kept, dropped = self.replay(program, order, recipes, region_nodes(carried))
        notes = [f"fission of F-Tree node {k} lost: no node of the new F-Tree covers its ops" for k in lost]
        return self.finish(base, base_order, carried, new.dgraph, kept, program, order,
                           (*applied, *notes, *dropped), depth, base_digest=new.digest, rewrites=rewrites)

    def resolve(self, state: State) -> State:
        """A pending state with its base rewritten and its F-Tree updated (see module doc):
        the state itself when its enabled regions carry over unchanged, else the state
        derived again on the new base. Raises DeriveError if the site fails on the base."""
        pending = state.pending
        if pending is None:
            return state
        t0 = time.perf_counter()
        new = self.rebased(pending.base_digest, pending.base, pending.base_order, pending.site,
                           state.tree, state.dgraph)
        carried, lost = carry_enabled(state.tree, new.tree)
        if not lost and same_regions(state.tree, carried):
            if new.dgraph is state.dgraph:    # the F-Tree stood: expansions can be carried
                self._carry_expansions(pending, new)
            state.base, state.base_order, state.tree, state.dgraph = (new.base, list(new.order), carried,
                                                                      new.dgraph)
            state.base_digest = new.digest
            state.pending = None
            self.record("resolve", t0)
            return state
        derived = self._on_rebased(new, state.tree, state.recipes, state.applied, state.depth, state.rewrites)
        self.record("resolve", t0)
        return derived

    def _carry_expansions(self, pending: PendingRebase, new: Rebased) -> None:
        """Link the new base to the old one in the expansion cache: its compact expansions may
        start from the old base's snapshots edited alike (peakcut.fission.reuse, rebase.alike)."""
        old = pending.base
        site = pending.site
        rules = self.rules

        def edit(graph: Graph, order: list[int]) -> tuple[Graph, list[int], tuple[int, ...]] | None:
            try:
                rw = rules.apply_rewrite(graph, order, site)
            except (RuleError, ValueError):
                return None
            return (rw.graph, list(rw.order), rw.removed) if alike(graph, old, rw, set(), set()) else None

        self.expansions.link(old, pending.base_order, new.base, new.dgraph, edit)

    def rebased(self, digest: str, base: Graph, base_order: list[int] | tuple[int, ...],
                site: RewriteSite, tree: FTree, dgraph: DGraph) -> Rebased:
        """`base` (of computation hash `digest`, F-Tree `tree`, D-Graph `dgraph`) rewritten at
        `site`, with its F-Tree (all disabled), D-Graph and digest: the same tree and D-Graph
        where the rewrite leaves every F-Tree node's dimensions alone (rebase.kept_tree), else
        Algorithm 1 on the new base. Made once per (base, site): states that share a base
        (they differ in fission or recipes only) offer the same sites, and the rewrite and
        the F-Tree update do not depend on the rest of the state."""
        key = (digest, site)
        found = self.rewritten.get(key) if digest else None
        if found is not None:
            return found
        try:
            rw = self.rules.apply_rewrite(base, list(base_order), site)
        except (RuleError, ValueError) as e:
            raise DeriveError(f"{site.description}: {e}") from None
        found = rebase(base, rw, tree, dgraph, self.levels, self.batch_only, self.workspace)
        if digest:
            if len(self.rewritten) >= REBASED_KEPT:
                del self.rewritten[next(iter(self.rewritten))]    # the oldest
            self.rewritten[key] = found
        return found

    def sites(self, state: State, limit: int) -> list[RewriteSite]:
        """TASO-style sites of the state's base (found once per base graph)."""
        digest = state.base_digest
        if digest not in self.taso_sites:
            self.taso_sites[digest] = self.rules.rewrite_candidates(state.base, state.base_order, limit=limit)
        return self.taso_sites[digest]

    def rescheduled(self, parent: State, rw: Rewrite, placements: dict[int, Placement] | None = None
                    ) -> list[int]:
        """Algorithm 2 on the interval around the change, when it lowers the peak; where it does
        not, on the wider interval between true cuts (schedule.incremental.CUTS). The nodes the
        rules place EARLY (a swap's store) stay right after what they read. placements: the
        rules' placements of rw.graph, where the caller has them."""
        if not self.reschedule:
            return rw.order
        nw = parent.narrow_waist
        if nw is None:
            nw = parent.narrow_waist = narrow_waist(parent.program, parent.order)
        touched = set(rw.changed) | set(rw.removed)
        rules: dict[tuple[int, int], IntervalRule] = {}
        for rule in (IntervalRule(), CUTS):
            span = reschedule_interval(parent.order, nw, touched, rule)
            if span is not None:
                rules.setdefault(span, rule)
        if not rules:
            return rw.order    # no narrow interval: Algorithm 2 would fall back to a full schedule
        h = rw.graph.with_order(rw.order)
        if placements is None:
            placements = self.rules.placements(rw.graph)
        early = [a for a in rw.added if placements.get(a) is Placement.EARLY]
        current = simulate(rw.graph, rw.order, self.workspace).peak_bytes
        for rule in rules.values():
            result = incremental_schedule(parent.order, nw, h, touched, rw.added, rule=rule,
                                          time_limit=RESCHEDULE_SECONDS, early=early)
            if result.peak_bytes < current:
                return list(result.order)
        return rw.order


def resolved(program: Graph, r: Recipe) -> Recipe:
    """Recipe r as its rule sees it in `program`: its users with the program's recomputes of
    r.copies_of that read r.tensor (Recipe doc) added; r itself when it names none."""
    return replace(r, users=(*r.users, *_copies(program, r))) if r.copies_of else r


def _copies(program: Graph, r: Recipe) -> tuple[int, ...]:
    """The program's recomputes of r.copies_of that read r.tensor."""
    wanted = set(r.copies_of)
    return tuple(sorted(u for u in program.users(r.tensor) if recomputed(program, u) in wanted))


def recomputed(program: Graph, nid: int) -> int | None:
    """The node that program node `nid` recomputes, or None where it is not a recompute."""
    tag = program.nodes[nid].tags.get(RematTag)
    return None if tag is None else tag.of


def narrow_waist(g: Graph, order: list[int]) -> dict[int, int]:
    h = g.with_order(order)
    problem = Problem(h)
    return {problem.ids[v]: value for v, value in Reachability(problem).narrow_waist().items()}


def region_nodes(tree: FTree) -> frozenset[int]:
    """Base node ids inside any enabled region (the program replaced them by part copies)."""
    out: set[int] = set()
    for f in tree.enabled():
        out |= f.nodes
    return frozenset(out)
