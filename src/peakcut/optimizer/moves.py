"""The rules the search applies to a state (MAGIS §5), as lazily built children.

Each Move names the child cheaply (`key`: what the child would be made of, to skip
duplicates before paying for it) and builds it on demand (`build`). Kinds:

- fission: the F-Tree mutations that apply (enable, lift, disable, mutate);
- remat / swap: applicable candidates at the memory hot-spot of the state's program
  (heuristic H2: only tensors live across the peak), outside every enabled region, one
  by one and all of a kind at once (a step the size of the hot-spot: many small
  activations are saved for backward in a CNN);
- taso: a TASO-style rewrite of the base graph (merge matmuls sharing an operand and its
  inverse, algebraic simplifications; peakcut.transform.taso) outside enabled regions;
- undo: de-remat / de-swap of a recipe the state holds.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from peakcut.fission.ftree import FTree, divisors
from peakcut.ir.graph import Graph
from peakcut.memory import MemoryProfile, simulate
from peakcut.optimizer.derive import Deriver, region_nodes
from peakcut.optimizer.state import Recipe, State
from peakcut.transform import Candidate, hotspot_candidates
from peakcut.transform.rewrite import describe_node, describe_tensor

CANDIDATES_PER_KIND = 4     # remat and swap candidates tried per expanded state
TASO_SITES = 16             # TASO-style sites listed per base graph (the kinds interleaved)


@dataclass(frozen=True)
class Move:
    kind: str                       # "fission" | "remat" | "swap" | "taso" | "undo"
    key: tuple                      # identifies the child's make-up
    description: str
    build: Callable[[], State]


@dataclass(frozen=True)
class MoveSettings:
    """Which rules the search may use (ablations switch some off)."""

    fission: bool = True
    remat: bool = True
    swap: bool = True
    hotspots_only: bool = True      # H2; False: candidates at every step's live set
    direct_enable: bool = True      # enable a root without enabled descendants directly
    together: bool = True           # also apply each kind's candidates all at once (a faster descent)
    taso: bool = True               # TASO-style rewrites of the base graph
    taso_per_state: int = 2         # TASO sites tried per expanded state
    per_kind: int = CANDIDATES_PER_KIND


def fission_rules(tree: FTree, direct_enable: bool) -> list[tuple[str, int]]:
    """The F-Tree mutations of §5.1, plus (beyond the paper) enabling a root whose
    descendants are all disabled: the root at n = 2 in one step instead of a leaf lifted
    level by level through states that each must look good enough to be expanded."""
    rules = tree.mutations()
    if direct_enable:
        plain = {k for rule, k in rules if rule == "enable"}
        for k in tree.roots():
            f = tree.nodes[k]
            if (not f.enabled and k not in plain and divisors(f.length)
                    and not any(tree.nodes[d].enabled for d in tree.descendants(k))):
                rules.append(("enable-any", k))
    return rules


def _enable_any(tree: FTree, k: int) -> FTree:
    return tree.with_n(k, divisors(tree.nodes[k].length)[0])


def make_key(state: State, tree_n: tuple[tuple[int, int], ...] | None = None,
             recipes: tuple[Recipe, ...] | None = None) -> tuple:
    tree_n = state.fission() if tree_n is None else tree_n
    recipes = state.recipes if recipes is None else recipes
    return (state.base_digest, tuple(sorted(tree_n)),
            tuple(sorted((r.kind, r.tensor, r.node, r.users) for r in recipes)))


def moves(state: State, deriver: Deriver, settings: MoveSettings, rng: random.Random) -> Iterator[Move]:
    """The state's children, fission first, then hot-spot remat/swap, then undos. A pending
    state (a TASO-style rewrite not yet made on its base) is resolved first (Deriver.resolve)."""
    if state.pending is not None:
        raise ValueError(f"state {state.applied[-1:]} is pending: Deriver.resolve it before its moves")
    if settings.fission:
        for rule, k in fission_rules(state.tree, settings.direct_enable):
            tree = state.tree.apply(rule, k) if rule != "enable-any" else _enable_any(state.tree, k)
            f = tree.nodes[k]
            what = f"fission: {rule} F-Tree node {k} ({len(f.nodes)} ops) -> n = {tree.nodes[k].n}"
            if rule == "lift" and f.parent is not None:
                what += f", parent {f.parent} at n = {tree.nodes[f.parent].n}"
            yield Move("fission", make_key(state, tuple((g.id, g.n) for g in tree.enabled())), what,
                       lambda tree=tree, what=what: deriver.with_tree(state, tree, what))
    kinds = [k for k in ("swap", "remat") if getattr(settings, k)]
    if kinds:
        yield from _recipe_moves(state, deriver, settings, kinds, rng)
    if settings.taso:
        regions = region_nodes(state.tree)
        outside = [s for s in deriver.sites(state, TASO_SITES) if not regions.intersection(s.nodes)]
        for site in outside[:settings.taso_per_state]:
            key = ("taso", *make_key(state), site.kind, site.nodes, site.parts)
            yield Move("taso", key, f"taso: {site.description}",
                       lambda site=site: deriver.with_taso(state, site))
    for r in state.recipes:
        rest = tuple(x for x in state.recipes if x != r)
        yield Move("undo", make_key(state, recipes=rest), f"undo: {r.description}",
                   lambda r=r: deriver.without_recipe(state, r))


def _recipe_moves(state: State, deriver: Deriver, settings: MoveSettings, kinds: list[str],
                  rng: random.Random) -> Iterator[Move]:
    program, order = state.program, state.order
    regions = region_nodes(state.tree)
    base = state.base
    profile = simulate(program, order, deriver.workspace)
    if settings.hotspots_only:
        found = hotspot_candidates(program, order, profile, limit=4 * settings.per_kind, kinds=kinds)
    else:
        found = _anywhere(program, order, settings, kinds, rng)
    picked: dict[str, list[Recipe]] = {k: [] for k in kinds}
    for c in found:
        touched = (c.node, *c.users)
        if any(v in regions or v not in base.nodes for v in touched) or c.tensor not in base.tensors:
            continue   # part copies or region nodes: the rule would cross a region boundary
        if c.kind == "swap":
            what = f"swap {describe_tensor(program, c.tensor)} out, back in for {len(c.users)} reader(s)"
        else:
            what = f"remat {describe_node(program, c.node)} for {len(c.users)} reader(s)"
        picked[c.kind].append(Recipe(c.kind, c.tensor, c.node, tuple(c.users), what))
    for kind, group in picked.items():
        for recipe in group[:settings.per_kind]:
            yield Move(kind, make_key(state, recipes=(*state.recipes, recipe)), recipe.description,
                       lambda recipe=recipe: deriver.with_recipe(state, recipe))
        if len(group) > 1 and settings.together:
            what = f"{kind} {len(group)} hot-spot tensors at once"
            yield Move(kind, make_key(state, recipes=(*state.recipes, *group)), what,
                       lambda group=tuple(group): deriver.with_recipes(state, group))


def _anywhere(program: Graph, order: list[int], settings: MoveSettings, kinds: list[str],
              rng: random.Random) -> list[Candidate]:
    """Without H2: candidates at a few random steps of the order instead of at the peak."""
    picks = []
    full = simulate(program, order)
    for _ in range(3):
        k = rng.randrange(len(order))
        shifted = _profile_at(full, k)
        picks.extend(hotspot_candidates(program, order, shifted, limit=settings.per_kind, kinds=kinds))
    rng.shuffle(picks)
    return picks


def _profile_at(profile: MemoryProfile, k: int) -> MemoryProfile:
    """The same profile with its 'peak' moved to step k (hot-spot candidates are found there)."""
    return replace(profile, peak_index=k)
