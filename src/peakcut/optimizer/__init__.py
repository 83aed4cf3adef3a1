"""The optimizer (MAGIS §3, §5, §6.2): best-first search over fission, re-materialization,
swapping and re-ordering, under a memory or a latency limit.

- objective.py: the two modes, limits, BetterThan and the relaxation δ;
- state.py: the search state and the computation hash that skips duplicates;
- derive.py: building a child state (expand fission, replay recipes, reschedule, simulate);
- children.py: a state's children, the registered rules (peakcut.rules) applied to it;
- search.py: Algorithm 3;
- root_rewrites.py: rewrites made on the root before the search; polish.py: rewrites made
  where the best plan peaks after it;
- verify.py: candidate plans run against the user's eager step (time, peak) before one is
  kept; numbers.py: their first step's numbers checked against eager's (fingerprints);
- plan.py: the runnable result (step, report, source, save/load);
- api.py: peakcut.optimize() and optimize_graph().
"""

from peakcut.optimizer.api import Optimized, optimize, optimize_graph
from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.objective import LimitError, Objective
from peakcut.optimizer.plan import LimitNotMet, Plan, load_plan
from peakcut.optimizer.search import Progress, SearchResult

__all__ = ["LimitError", "LimitNotMet", "MoveSettings", "Objective", "Optimized", "Plan", "Progress",
           "SearchResult", "load_plan", "optimize", "optimize_graph"]
