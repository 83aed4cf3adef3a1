"""Schedule one contiguous interval of an order: partition at narrow waists, DP or greedy per segment.

This is the DpSchedule/GraphPartition core shared by full scheduling and
incremental rescheduling (MAGIS Algorithm 2): the nodes order[start:stop]
are re-ordered among themselves; everything before and after stays put.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from peakcut.schedule.dp import DPTimeout, dp_window, window_context, window_peak
from peakcut.schedule.greedy import greedy_order
from peakcut.schedule.partition import segments
from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import Reachability


@dataclass(frozen=True)
class IntervalSettings:
    """Bounds of the per-segment DP: larger segments (or a timeout) use the greedy order."""

    dp_max_nodes: int = 60         # segments larger than this are not given to the DP
    dp_max_states: int = 4096      # states kept per DP layer (beyond: best-first, inexact)
    dp_seconds: float = 2.0        # wall-clock limit per segment


@dataclass
class IntervalStats:
    segments: int = 0
    dp_segments: int = 0
    exact_segments: int = 0
    greedy_segments: int = 0
    dp_states: int = 0
    timeouts: int = 0
    notes: list[str] = field(default_factory=list)

    def merge(self, other: IntervalStats) -> None:
        self.segments += other.segments
        self.dp_segments += other.dp_segments
        self.exact_segments += other.exact_segments
        self.greedy_segments += other.greedy_segments
        self.dp_states += other.dp_states
        self.timeouts += other.timeouts


def schedule_interval(problem: Problem, order: list[int], start: int, stop: int,
                      settings: IntervalSettings, stats: IntervalStats | None = None,
                      reach: Reachability | None = None) -> list[int]:
    """`order` with order[start:stop] re-ordered for low peak memory (never a higher one).

    reach: reachability of exactly the interval's nodes, if the caller already has it.
    """
    stats = stats if stats is not None else IntervalStats()
    parts = segments(problem, order[start:stop], reach=reach)
    stats.segments += len(parts)
    # reference order: segments one after another, each in capture order
    current = order[:start] + [v for part in parts for v in part] + order[stop:]
    offset = start
    for part in parts:
        lo, hi = offset, offset + len(part)
        offset = hi
        current = _schedule_segment(problem, current, lo, hi, settings, stats)
    return current


def _schedule_segment(problem: Problem, order: list[int], lo: int, hi: int,
                      settings: IntervalSettings, stats: IntervalStats) -> list[int]:
    if hi - lo <= 1:
        return order
    first, last = problem.intervals(order)
    ctx = window_context(problem, order, lo, hi, first, last)
    local = {v: j for j, v in enumerate(ctx.nodes)}
    options: list[list[int]] = [order[lo:hi]]
    position = problem.to_positions(order)
    options.append(greedy_order(problem, order[lo:hi], position))
    peaks = [window_peak(ctx, [local[v] for v in opt]) for opt in options]
    best = min(range(len(options)), key=lambda i: peaks[i])
    best_nodes, best_peak = options[best], peaks[best]
    if hi - lo <= settings.dp_max_nodes:
        stats.dp_segments += 1
        try:
            result = dp_window(ctx, best_peak, settings.dp_max_states,
                               time.perf_counter() + settings.dp_seconds)
        except DPTimeout:
            stats.timeouts += 1
            result = None
        if result is not None:
            stats.dp_states += result.states
            stats.exact_segments += int(result.exact)
            if result.peak_bytes <= best_peak:
                best_nodes = result.order
    else:
        stats.greedy_segments += 1
    return order[:lo] + best_nodes + order[hi:]
