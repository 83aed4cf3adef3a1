"""Operator ordering for low peak memory.

    from peakcut.schedule import schedule
    s = schedule(graph)            # s.order, s.peak_bytes, s.eager_peak_bytes, s.lower_bound_bytes

- problem.py: the graph as integer arrays, exact vectorised memory of an order;
- reach.py: ancestor/descendant bitsets, narrow-waist values, an order-free lower bound;
- dp.py: Serenity-style DP over a window of nodes (pruned, capped, timed);
- greedy.py: memory-aware list scheduling (fallback for large partitions);
- partition.py: GraphPartition at narrow waists (nw <= 1);
- interval.py: partition + DP/greedy for one interval of an order;
- refine.py, moves.py: local search (DP windows at the peak, long-range block moves);
- full.py: schedule(), the full scheduler;
- incremental.py: Algorithm 2, rescheduling only an interval after a local change;
- placement.py: where stores, loads and recomputes go.
"""

from peakcut.schedule.full import Schedule, schedule
from peakcut.schedule.incremental import IncrementalResult, IntervalRule, incremental_schedule
from peakcut.schedule.interval import IntervalSettings, IntervalStats, schedule_interval
from peakcut.schedule.placement import place
from peakcut.schedule.problem import Problem
from peakcut.schedule.reach import Reachability, lower_bound

__all__ = [
    "IncrementalResult", "IntervalRule", "IntervalSettings", "IntervalStats", "Problem", "Reachability",
    "Schedule", "incremental_schedule", "lower_bound", "place", "schedule", "schedule_interval",
]
