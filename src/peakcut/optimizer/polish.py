"""The polish after the search: rewrites made where the best plan peaks, on its program, in
every phase that runs after the search (peakcut.rules.phase; the built-in one is POLISH).

    result = polished(result, deriver, objective, deadline)

The search meets rewrite sites on the base graph, ranked by the base's memory (a few per
expanded state); the plan it keeps peaks somewhere else, after its recomputes and swaps moved
the peak. A rewrite rule of such a phase names a site at the node where a plan peaks
(RewriteRule.sites, Query.peak); phase by phase, the polish applies the first such site of
the registry's rules to the best plan's program (not its base:
the recipes stay as they were applied, reading what they read), again at the new peak, up to
POLISH_ROUNDS times, and keeps each step only where the objective prefers it (lower peak
within a latency limit; under a memory limit the plan keeps its latency unless it misses the
limit). It has POLISH_SHARE of the time the search is given (optimizer.shares), and its first
round in any case (one rewrite and one simulation of the plan: about half a second at paper
size; with only what a 60 s search left, paper U-Net's polish got one round of the two it
takes). Only nodes of the
base outside every enabled fission region, and nodes an earlier round made, are sites (a part
copy runs inside a loop the code generator writes from the region). Two rules run in POLISH:
split_conv_grads (a CNN's plans peak at a convolution's backward, where the input gradient is
held beside the weight gradient's scratch), then split_rows (the input-gradient call that
split made, when the plan peaks there next, in 4 parts along the rows).

The polished plan becomes the search's best and the newest of its bests, so verification runs
it first; the plan it was made from stays among the bests. Its program is not its base with
its recipes replayed (the search never derives from it again).
"""

from __future__ import annotations

import time
from dataclasses import replace

from peakcut.memory import simulate
from peakcut.optimizer.derive import DeriveError, Deriver, region_nodes
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.search import SearchResult
from peakcut.optimizer.state import State
from peakcut.rules.base import RewriteRule
from peakcut.rules.phase import Phase, declared
from peakcut.rules.query import Query
from peakcut.transform.rewrite import RuleError
from peakcut.transform.site import RewriteSite

POLISH_ROUNDS = 8          # rewrites tried at the plan's successive peaks


def _at_peak(phase: Phase, state: State, deriver: Deriver, made: set[int]
             ) -> tuple[RewriteRule, RewriteSite, Query] | None:
    """The first site of the registry's rewrite rules of `phase` at the node where `state`'s
    program peaks, when that node is a base node outside every enabled region or one the
    polish made (`made`), with the query that found it."""
    peak = simulate(state.program, state.order, deriver.workspace).peak_node
    if peak is None or peak in region_nodes(state.tree) or (peak not in state.base.nodes and peak not in made):
        return None
    query = Query(state.program, state.order, phase=phase, peak=peak)
    for rule in deriver.rules.rewrites:
        site = next(iter(rule.sites(query)), None) if phase in rule.phases else None
        if site is not None:
            return rule, site, query
    return None


def polish(best: State, deriver: Deriver, objective: Objective, deadline: float,
           phase: Phase) -> State | None:
    """`best` (on its full expansion) with the rewrites of `phase` at its peak applied to its
    program while the objective prefers them (module doc); None where none was kept."""
    state = deriver.exact(best)
    kept = False
    made: set[int] = set()
    for round_ in range(POLISH_ROUNDS):
        if round_ > 0 and time.perf_counter() >= deadline:     # the first round runs in any case
            break
        found = _at_peak(phase, state, deriver, made)
        if found is None:
            break
        rule, site, query = found
        try:
            rw = rule.apply(state.program, state.order, site)
        except (RuleError, ValueError):
            break
        child = deriver.finish(state.base, state.base_order, state.tree, state.dgraph, state.recipes, rw.graph,
                               list(rw.order), (*state.applied, rule.describe(query, site)), state.depth + 1,
                               compact=False, base_digest=state.base_digest, rewrites=state.rewrites)
        if not objective.better(objective.key(child.peak_bytes, child.latency_s),
                                objective.key(state.peak_bytes, state.latency_s)):
            break
        state, kept = child, True
        made = (made | set(rw.added)) & state.program.nodes.keys()
    return state if kept else None


def polished(result: SearchResult, deriver: Deriver, objective: Objective, deadline: float) -> SearchResult:
    """The search's result with its best polished in every phase after the search (module
    doc); the result itself where the polish keeps nothing."""
    for phase in declared(deriver.rules.rewrites, "after"):
        try:
            state = polish(result.best, deriver, objective, deadline, phase)
        except DeriveError:      # the best's recipes fail on its full expansion: leave it to verification
            return result
        if state is not None:
            result = replace(result, best=state, bests=[*result.bests, state])
    return result
