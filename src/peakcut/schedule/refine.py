"""Local search after a first order: DP windows at the peak, hoisting over it, block moves."""

from __future__ import annotations

import time

from peakcut.schedule.dp import DPTimeout, dp_window, window_context
from peakcut.schedule.moves import improve_by_hoisting, improve_by_moves
from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import Reachability

WINDOWS = (16, 32)  # window sizes tried around the peak, smallest first


def _score(problem: Problem, order: list[int]) -> tuple[int, int]:
    c = problem.curve(order)
    return c.peak_bytes, int(c.timeline.sum())


def refine_windows(problem: Problem, order: list[int], deadline: float, floor: int = 0,
                   max_states: int = 2048) -> list[int]:
    """Re-order windows centred on the current peak while that lowers (peak, area)."""
    best = list(order)
    score = _score(problem, best)
    improved = True
    while improved and score[0] > floor and time.perf_counter() < deadline:
        improved = False
        curve = problem.curve(best)
        first, last = problem.intervals(best)
        for width in WINDOWS:
            lo = max(0, curve.peak_index - width // 2)
            hi = min(problem.n, lo + width)
            ctx = window_context(problem, best, lo, hi, first, last)
            try:
                result = dp_window(ctx, curve.peak_bytes, max_states, deadline)
            except DPTimeout:
                return best
            if result is None:
                continue
            candidate = best[:lo] + result.order + best[hi:]
            new = _score(problem, candidate)
            if new < score:
                best, score, improved = candidate, new, True
                break
    return best


def refine(problem: Problem, order: list[int], reach: Reachability, deadline: float,
           floor: int = 0) -> list[int]:
    """Alternate window DP, hoisting and block moves until none lowers (peak, area) or time is up."""
    best = list(order)
    score = _score(problem, best)
    while time.perf_counter() < deadline and score[0] > floor:
        best = refine_windows(problem, best, deadline, floor)
        best = improve_by_hoisting(problem, best, reach, deadline, floor)
        best = improve_by_moves(problem, best, reach, deadline, floor)
        new = _score(problem, best)
        if new >= score:
            break
        score = new
    return best
