"""Full scheduling: a memory-minimising topological order of a whole graph.

Candidates: the capture (eager) order, the greedy list schedule, and the
narrow-waist partition with a DP per segment; the best is refined by local
search (DP windows at the peak, block moves) until it reaches the
order-independent lower bound or the time limit. The result is never worse
than the capture order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from peakcut.ir.graph import Graph
from peakcut.memory.workspace import WorkspaceSpec
from peakcut.schedule.greedy import greedy_order
from peakcut.schedule.interval import IntervalSettings, IntervalStats, schedule_interval
from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import Reachability, lower_bound
from peakcut.schedule.refine import refine


@dataclass(frozen=True)
class Schedule:
    """A re-ordered step: node ids in order, its simulated peak and how it was found."""

    order: list[int]
    peak_bytes: int
    eager_peak_bytes: int
    lower_bound_bytes: int      # no order of this graph can peak lower (simulated, same model)
    seconds: float
    method: str                 # the candidate that won ("eager", "greedy", "partition-dp") [+refine]
    stats: dict[str, object] = field(default_factory=dict)  # search counters, for reports

    @property
    def reduction(self) -> float:
        """Fraction of the eager peak saved by re-ordering."""
        return 1 - self.peak_bytes / self.eager_peak_bytes if self.eager_peak_bytes else 0.0

    @property
    def optimal(self) -> bool:
        return self.peak_bytes <= self.lower_bound_bytes


def schedule(g: Graph, *, time_limit: float = 20.0, workspace: WorkspaceSpec = "auto",
             settings: IntervalSettings | None = None, problem: Problem | None = None) -> Schedule:
    """Schedule the whole graph for minimum simulated peak memory within `time_limit` seconds."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    problem = problem or Problem(g, workspace)
    settings = settings or IntervalSettings()
    reach = Reachability(problem)
    floor = lower_bound(problem, reach)
    eager = problem.eager_order()
    candidates: dict[str, list[int]] = {"eager": eager, "greedy": greedy_order(problem)}
    stats = IntervalStats()
    candidates["partition-dp"] = schedule_interval(problem, eager, 0, problem.n, settings, stats, reach)
    peaks = {name: problem.peak(o) for name, o in candidates.items()}
    method = min(peaks, key=lambda name: (peaks[name], list(candidates).index(name)))
    best = candidates[method]
    peak = peaks[method]
    if peak > floor:
        refined = refine(problem, best, reach, deadline, floor)
        refined_peak = problem.peak(refined)
        if refined_peak < peak:
            best, peak, method = refined, refined_peak, method + "+refine"
    return Schedule(
        order=problem.node_ids(best), peak_bytes=peak, eager_peak_bytes=peaks["eager"],
        lower_bound_bytes=floor, seconds=time.perf_counter() - t0, method=method,
        stats={"candidate_peaks": peaks, "segments": stats.segments,
               "dp_segments": stats.dp_segments, "exact_segments": stats.exact_segments,
               "dp_timeouts": stats.timeouts},
    )
