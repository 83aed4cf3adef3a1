"""The search's figures priced again after its calls are measured, before they are judged.

A search on a cold cost cache runs on fitted prices (peakcut.optimizer.budget): a state keeps
the latency it was priced at when it was built. Before the plan is chosen and verified, the
calls of the states that can become the plan (the search's root, its latest bests, its best)
and of the eager step that a latency limit is a ratio of are measured, as far as the
deadline allows, and those states and the eager step are simulated again on what is now
measured; the best is then the one the objective prefers on the new figures.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from peakcut.ir.graph import Graph
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.optimizer.budget import BudgetedCost
from peakcut.optimizer.compact import RepeatedCost
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.search import SearchResult
from peakcut.optimizer.state import State
from peakcut.simulate import Timeline, simulate_timeline

REPRICED_BESTS = 12
"""The latest bests priced again (the candidates verification may run are among them)."""


def repriced_states(result: SearchResult, extra: tuple[State, ...] = ()) -> list[State]:
    """`extra`, the root, the latest REPRICED_BESTS bests and the best, each once."""
    found: list[State] = []
    seen: set[int] = set()
    for s in (*extra, result.root, *result.bests[-REPRICED_BESTS:], result.best):
        if id(s) not in seen:
            seen.add(id(s))
            found.append(s)
    return found


def reprice(cost: BudgetedCost, g: Graph, result: SearchResult, workspace: WorkspaceSpec,
            deadline: float, extra: tuple[State, ...] = ()) -> tuple[Timeline, dict[str, Any]]:
    """Measure the fitted calls of `g` and of the states that can become the plan (and
    `extra`: the untransformed step where root rewrites made the root) until `deadline`,
    then price those states (in place) and `g` in capture order again; the new eager
    timeline and what was done, for the report."""
    t0 = time.perf_counter()
    states = repriced_states(result, extra)
    keys = cost.keys_of(g)
    for s in states:
        keys |= cost.keys_of(s.program)
    measured = cost.measure_some(deadline - t0, keys) if keys else 0
    for s in states:
        priced = RepeatedCost(cost, s.tree) if s.compact and s.tree.enabled() else cost
        tl = simulate_timeline(s.program, s.order, priced, workspace)
        s.latency_s, s.peak_bytes = tl.latency_seconds, tl.peak_bytes
    eager = simulate_timeline(g, g.order, cost, workspace)
    return eager, {"states": len(states), "fitted_calls": len(keys), "measured": measured,
                   "still_fitted": len(keys) - measured, "seconds": round(time.perf_counter() - t0, 3)}


def rebest(result: SearchResult, planned: Objective) -> SearchResult:
    """`result` with the best the objective prefers among its root, its full-expansion bests
    and its best, on their figures now (the newest of equals)."""
    def key(s: State) -> tuple[int, float, float]:
        return planned.key(s.peak_bytes, s.latency_s)

    winner = result.root
    for s in (*result.bests, result.best):
        if (not s.compact or s is result.best) and not planned.better(key(winner), key(s)):
            winner = s
    return result if winner is result.best else replace(result, best=winner)
