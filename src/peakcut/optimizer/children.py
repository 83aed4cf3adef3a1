"""A state's children: the registered rules (peakcut.rules.RULES) applied to it, as lazily
built moves (MAGIS §5).

Each Move names the child cheaply (`key`: what the child would be made of, to skip
duplicates before paying for it) and builds it on demand (`build`). In the registry's order:

- region rules (fission): the F-Tree mutations that apply;
- program rules (swap, remat): applicable candidates at the memory hot-spot of the state's
  program (heuristic H2: only tensors live across the peak), outside every enabled region,
  one by one and all of a kind at once (a step the size of the hot-spot: many small
  activations are saved for backward in a CNN); a batched rule (offloads of a model's
  parameters and state) also at every one of its sites at once;
- rewrite rules of a phase during the search (TASO-style rewrites of the base graph, block
  checkpoints, splits), outside enabled regions unless a phase lets them in, all of move kind
  "taso";
- undo: dropping a recipe the state holds (de-remat, de-swap), or all of a batched rule's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from functools import partial

from peakcut.ir.graph import Graph
from peakcut.ir.tags import FissionTag
from peakcut.memory import MemoryProfile, simulate
from peakcut.optimizer.derive import Deriver, recomputed, region_nodes, resolved
from peakcut.optimizer.state import Recipe, State
from peakcut.rules import REWRITE_MOVES, UNDO_MOVES, Candidate, Registry
from peakcut.rules.base import ProgramRule, Site
from peakcut.rules.phase import inside_regions
from peakcut.rules.query import Query

CANDIDATES_PER_KIND = 4     # program-rule candidates tried per kind per expanded state
TASO_SITES = 16             # TASO-style sites listed per base graph (the kinds interleaved)
UNDO_SINGLES = 32           # recipes of non-batched rules undone one by one (the latest ones)


@dataclass(frozen=True)
class Move:
    kind: str                       # a rule's kind, REWRITE_MOVES ("taso") or UNDO_MOVES ("undo")
    key: tuple[object, ...]         # identifies the child's make-up
    description: str
    build: Callable[[], State]
    rule: str = ""                  # a rewrite move's rule kind (its kind is REWRITE_MOVES)


@dataclass(frozen=True)
class MoveSettings:
    """Which rules the search may use (ablations switch some off), and how many of each.

    kinds: the move kinds used (Registry.move_kinds: "fission", "swap", "remat", "taso"); None
    for all. Undos of the recipes a state holds are always tried.
    """

    kinds: frozenset[str] | None = None
    hotspots_only: bool = True      # H2; False: candidates at every step's live set
    direct_enable: bool = True      # enable a root without enabled descendants directly
    together: bool = True           # also apply each kind's candidates all at once (a faster descent)
    bulk: bool = True               # and a batched rule at every one of its sites (an LLM's 300 updates)
    taso_per_state: int = 3         # TASO sites tried per expanded state (module doc of rules.checkpoint_segments_rule)
    per_kind: int = CANDIDATES_PER_KIND

    @classmethod
    def only(cls, *kinds: str) -> MoveSettings:
        """Settings using these move kinds only (the other fields at their defaults)."""
        return cls(kinds=frozenset(kinds))

    def uses(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def check(self, rules: Registry) -> None:
        """ValueError when `kinds` names a move kind the registry does not have."""
        unknown = sorted(set(self.kinds or ()) - set(rules.move_kinds))
        if unknown:
            raise ValueError(f"MoveSettings kinds {unknown} are not move kinds of the registry; "
                             f"known: {rules.move_kinds}")


def make_key(state: State, tree_n: tuple[tuple[int, int], ...] | None = None,
             recipes: tuple[Recipe, ...] | None = None) -> tuple[object, ...]:
    tree_n = state.fission() if tree_n is None else tree_n
    recipes = state.recipes if recipes is None else recipes
    return (state.base_digest, tuple(sorted(tree_n)),
            tuple(sorted((r.kind, r.tensor, r.node, r.users, r.copies_of) for r in recipes)))


def children(state: State, deriver: Deriver, settings: MoveSettings, rng: random.Random) -> Iterator[Move]:
    """The state's children, in the registry's order (see module doc). A pending state (a
    TASO-style rewrite not yet made on its base) must be resolved first (Deriver.resolve)."""
    if state.pending is not None:
        raise ValueError(f"state {state.applied[-1:]} is pending: Deriver.resolve it before its moves")
    rules = deriver.rules
    query = Query(state.program, state.order, tree=state.tree, direct_enable=settings.direct_enable)
    for region_rule in rules.regions:
        if not settings.uses(region_rule.kind):
            continue
        for mutation in region_rule.sites(query):
            tree = region_rule.apply(state.tree, mutation)
            what = region_rule.describe(query, mutation)
            yield Move(region_rule.kind, make_key(state, tuple((g.id, g.n) for g in tree.enabled())), what,
                       partial(deriver.with_tree, state, tree, what))
    kinds = [k for k in rules.program_kinds if settings.uses(k)]
    if kinds:
        yield from _program_moves(state, deriver, settings, kinds, rng)
    if rules.rewrites and settings.uses(REWRITE_MOVES):
        regions = region_nodes(state.tree)
        outside = [s for s in deriver.sites(state, TASO_SITES)
                   if inside_regions(rules.rewrite_rule(s.kind)) or not regions.intersection(s.nodes)]
        on_base = Query(state.base, state.base_order)
        for site in outside[:settings.taso_per_state]:
            key = (REWRITE_MOVES, *make_key(state), site.kind, site.nodes, site.params)
            yield Move(REWRITE_MOVES, key, rules.rewrite_rule(site.kind).describe(on_base, site),
                       partial(deriver.with_taso, state, site), rule=site.kind)
    yield from _undo_moves(state, deriver)


def _undo_moves(state: State, deriver: Deriver) -> Iterator[Move]:
    """Dropping recipes: each of the last UNDO_SINGLES recipes of the non-batched rules on its
    own, and all the recipes of each batched rule at once (an LLM's 582 offloads are one
    recipe each: one undo move apiece would make every expansion replay them 582 times)."""
    batched = {r.kind for r in state.recipes if deriver.rules.program_rule(r.kind).batched}
    singles = [r for r in state.recipes if r.kind not in batched]
    for r in singles[-UNDO_SINGLES:]:
        rest = tuple(x for x in state.recipes if x != r)
        yield Move(UNDO_MOVES, make_key(state, recipes=rest), f"undo: {r.description}",
                   partial(deriver.without_recipes, state, (r,)))
    for kind in sorted(batched):
        dropped = tuple(r for r in state.recipes if r.kind == kind)
        if len(dropped) == 1:
            what = f"undo: {dropped[0].description}"
        else:
            what = f"undo: {kind} at all {len(dropped)} of its sites"
        rest = tuple(x for x in state.recipes if x.kind != kind)
        yield Move(UNDO_MOVES, make_key(state, recipes=rest), what,
                   partial(deriver.without_recipes, state, dropped))


def _program_moves(state: State, deriver: Deriver, settings: MoveSettings, kinds: list[str],
                   rng: random.Random) -> Iterator[Move]:
    program, order = state.program, state.order
    regions = region_nodes(state.tree)
    base = state.base
    profile = simulate(program, order, deriver.workspace)
    query = Query(program, order, profile=profile)
    if settings.hotspots_only:
        found = deriver.rules.hotspot_candidates(program, order, profile, limit=4 * settings.per_kind,
                                                 kinds=kinds)
    else:
        found = _anywhere(program, order, deriver.rules, settings, kinds, rng)
    picked: dict[str, list[Recipe]] = {k: [] for k in kinds}
    for c in found:
        recipe = _recipe(c.rule, c, query, base, regions)
        if recipe is not None:
            picked[c.kind].append(recipe)
    for kind, group in picked.items():
        for recipe in group[:settings.per_kind]:
            yield Move(kind, make_key(state, recipes=(*state.recipes, recipe)), recipe.description,
                       partial(deriver.with_recipe, state, recipe))
        if len(group) > 1 and settings.together:
            what = f"{kind} {len(group)} hot-spot tensors at once"
            yield Move(kind, make_key(state, recipes=(*state.recipes, *group)), what,
                       partial(deriver.with_recipes, state, tuple(group)))
    if settings.bulk:
        yield from _bulk_moves(state, deriver, kinds, query, regions, {k: len(v) for k, v in picked.items()})


def _bulk_moves(state: State, deriver: Deriver, kinds: list[str], query: Query,
                regions: frozenset[int], picked: dict[str, int]) -> Iterator[Move]:
    """Each batched rule (ProgramRule.batched) at every one of its sites, as one move, where
    that is more than the hot-spot moves above took: the step from a model's state on the
    device to all of it offloaded is one move, not one per parameter. The sites are checked
    when the move is built (Deriver.with_recipes, in one edit)."""
    base = state.base
    for kind in kinds:
        rule = deriver.rules.program_rule(kind)
        if not rule.batched:
            continue
        held = {(r.kind, r.tensor) for r in state.recipes}
        recipes = tuple(r for site in rule.sites(query) if (kind, site.tensor) not in held
                        and (r := _recipe(rule, site, query, base, regions)) is not None)
        if len(recipes) > max(1, picked.get(kind, 0)):
            yield Move(kind, make_key(state, recipes=(*state.recipes, *recipes)),
                       f"{kind} at all {len(recipes)} of its sites at once",
                       partial(deriver.with_recipes, state, recipes))


def root_bulk_moves(state: State, deriver: Deriver, settings: MoveSettings) -> Iterator[Move]:
    """The move at every site of each batched rule that asks to be tried on the search's root
    (ProgramRule.at_root), in the registry's order, where the settings use the rule."""
    kinds = [k for k in deriver.rules.program_kinds if settings.uses(k) and deriver.rules.program_rule(k).at_root]
    if kinds:
        query = Query(state.program, state.order, profile=simulate(state.program, state.order, deriver.workspace))
        yield from _bulk_moves(state, deriver, kinds, query, region_nodes(state.tree), {})


def _recipe(rule: ProgramRule, site: Site, query: Query, base: Graph, regions: frozenset[int]) -> Recipe | None:
    """The recipe of `rule` at a site of the state's program (query.g), in base ids; None where the site
    touches a region (a region node or a part copy: the rule would cross a region boundary)
    or names what the base does not have. A batched rule's sites are their tensors (its
    apply reads no node of the site), so nodes other recipes added (a host update's copies
    reading a parameter) are left out of its recipe instead of ruling the site out. Another
    rule's users may be recomputes (remat copies) of base nodes: the recipe names the nodes
    they recompute (Recipe.copies_of). Without them a ReLU output that a recomputed
    convolution reads could never be swapped: paper U-Net at <= 10% on RTX 3090 kept two
    512 MiB encoder ReLUs in device memory across its whole step (simulated)."""
    program = query.g
    if site.tensor not in base.tensors:
        return None
    touched = (site.node, *site.users)
    if any(v in regions or (v not in base.nodes and _part_copy(program, v)) for v in touched):
        return None
    if rule.batched:
        touched = tuple(v for v in touched if v in base.nodes)
        if not touched:
            return None
        return Recipe(rule.kind, site.tensor, touched[0], tuple(touched[1:]), rule.describe(query, site))
    if site.node not in base.nodes:
        return None
    copies = [recomputed(program, v) for v in site.users if v not in base.nodes]
    if any(v is None or v not in base.nodes for v in copies):
        return None
    recipe = Recipe(rule.kind, site.tensor, site.node, tuple(v for v in site.users if v in base.nodes),
                    rule.describe(query, site), tuple(sorted({v for v in copies if v is not None})))
    # the recipe must name no more and no fewer readers than the site: not where a node is
    # recomputed twice and the site reads one copy, nor where a copy reads a view of the tensor
    return recipe if set(resolved(program, recipe).users) == set(site.users) else None


def _part_copy(program: Graph, nid: int) -> bool:
    node = program.nodes.get(nid)
    return node is None or node.tags.get(FissionTag) is not None


def _anywhere(program: Graph, order: list[int], rules: Registry, settings: MoveSettings, kinds: list[str],
              rng: random.Random) -> list[Candidate]:
    """Without H2: candidates at a few random steps of the order instead of at the peak."""
    picks = []
    full = simulate(program, order)
    for _ in range(3):
        k = rng.randrange(len(order))
        shifted = _profile_at(full, k)
        picks.extend(rules.hotspot_candidates(program, order, shifted, limit=settings.per_kind, kinds=kinds))
    rng.shuffle(picks)
    return picks


def _profile_at(profile: MemoryProfile, k: int) -> MemoryProfile:
    """The same profile with its 'peak' moved to step k (hot-spot candidates are found there)."""
    return replace(profile, peak_index=k)
