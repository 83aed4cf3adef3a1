"""The polish after the search: rewrites made where the best plan peaks, on its program.

    result = polished(result, deriver, objective, deadline)

The search meets rewrite sites on the base graph, ranked by the base's memory (a few per
expanded state); the plan it keeps peaks somewhere else, after its recomputes and swaps moved
the peak. A rewrite rule with `at_peak` (peakcut.rules.protocol.RewriteRule) names a site at
the node where a plan peaks; the polish applies it to the best plan's program (not its base:
the recipes stay as they were applied, reading what they read), again at the new peak, up to
POLISH_ROUNDS times, and keeps each step only where the objective prefers it (lower peak
within a latency limit; under a memory limit the plan keeps its latency unless it misses the
limit). It has POLISH_SHARE of the time the search is given (optimizer.api), and its first
round in any case (one rewrite and one simulation of the plan: about half a second at paper
size; with only what a 60 s search left, paper U-Net's polish got one round of the two it
takes). Only nodes of the
base outside every enabled fission region, and nodes an earlier round made, are sites (a part
copy runs inside a loop the code generator writes from the region). Two rules have `at_peak`:
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
from peakcut.rules.protocol import RewriteRule
from peakcut.transform.rewrite import RuleError
from peakcut.transform.taso.find import TasoCandidate

POLISH_ROUNDS = 8          # rewrites tried at the plan's successive peaks
POLISH_SHARE = 0.03        # of the search's time, kept for the polish


def _at_peak(state: State, deriver: Deriver, made: set[int]) -> tuple[RewriteRule, TasoCandidate] | None:
    """The first at_peak site of the registry's rewrite rules at the node where `state`'s
    program peaks, when that node is a base node outside every enabled region or one the
    polish made (`made`)."""
    peak = simulate(state.program, state.order, deriver.workspace).peak_node
    if peak is None or peak in region_nodes(state.tree) or (peak not in state.base.nodes and peak not in made):
        return None
    for rule in deriver.rules.rewrites:
        at_peak = getattr(rule, "at_peak", None)     # a rule written to the protocol without subclassing it
        site = at_peak(state.program, state.order, peak) if at_peak is not None else None
        if site is not None:
            return rule, site
    return None


def polish(best: State, deriver: Deriver, objective: Objective, deadline: float) -> State | None:
    """`best` (on its full expansion) with at_peak rewrites applied to its program while the
    objective prefers them (module doc); None where none was kept."""
    state = deriver.exact(best)
    kept = False
    made: set[int] = set()
    for round_ in range(POLISH_ROUNDS):
        if round_ > 0 and time.perf_counter() >= deadline:     # the first round runs in any case
            break
        found = _at_peak(state, deriver, made)
        if found is None:
            break
        rule, site = found
        try:
            rw = rule.apply(state.program, state.order, site)
        except (RuleError, ValueError):
            break
        child = deriver.finish(state.base, state.base_order, state.tree, state.dgraph, state.recipes, rw.graph,
                               list(rw.order), (*state.applied, rule.describe(site)), state.depth + 1,
                               compact=False, base_digest=state.base_digest, rewrites=state.rewrites)
        if not objective.better(objective.key(child.peak_bytes, child.latency_s),
                                objective.key(state.peak_bytes, state.latency_s)):
            break
        state, kept = child, True
        made = (made | set(rw.added)) & state.program.nodes.keys()
    return state if kept else None


def polished(result: SearchResult, deriver: Deriver, objective: Objective, deadline: float) -> SearchResult:
    """The search's result with its best polished (module doc); the result itself where the
    polish keeps nothing."""
    try:
        state = polish(result.best, deriver, objective, deadline)
    except DeriveError:          # the best's recipes fail on its full expansion: leave it to verification
        return result
    if state is None:
        return result
    return replace(result, best=state, bests=[*result.bests, state])
