"""The optimizer (MAGIS §3, §5, §6.2): best-first search over fission, re-materialization,
swapping and re-ordering, under a memory or a latency limit.

- objective.py: the two modes, limits, BetterThan and the relaxation δ;
- state.py: the search state and the computation hash that skips duplicates;
- derive.py: building a child state (expand fission, replay recipes, reschedule, simulate);
  rebase.py: a base rewritten by a rewrite rule, and what of a state carries over to it;
  timing.py: how long derivations take (what the search leaves time for);
- compact.py: a compact fission expansion priced per part;
- children.py: a state's children, the registered rules (peakcut.rules) applied to it;
- search.py: Algorithm 3; parallel.py: the search on several processes;
  collector.py: Python's garbage collector, relaxed while the search runs;
- root_rewrites.py: rewrites made on the root before the search; polish.py: rewrites made
  where the best plan peaks after it;
- budget.py: a measured cost model inside a time budget: calls not measured yet priced by
  fitted prices and measured in slices between expansions; reprice.py: the states that can
  become the plan priced again on what is measured, before they are judged;
  context.py: the per-op times calibrated to the whole step and the user's eager step;
- verify.py: candidate plans run against the user's eager step (time, peak) before one is
  kept; numbers.py: their first step's numbers checked against eager's (fingerprints);
  verification.py: optimize's verification step, its verdict in the report; user_step.py:
  the user's eager step and the state it runs from, kept and put back around every run;
- plan.py: the runnable result (step, report, source, save/load);
- floors.py: the step's physical floors (memory, compute, latency at the memory floor);
  baselines.py: the ZeRO-Offload-style peer priced on the same timeline;
  peak_standing.py: what stands at a plan's peak, and how much of it fission parts hold;
  held_floor.py: memory limits no plan can meet on a host device (held bytes, whole ops);
- optimized.py: what optimize_graph found; report.py: its report; arena.py: its arena and
  predicted reserved bytes (the plan's order laid out, the allocator modelled), the default
  arena, and with an arena the limit on held + arena + unplanned bytes (the search's margin,
  the plan kept);
  limit_messages.py: the sentences of a LimitNotMet;
- shares.py: how an optimize call shares its time budget; phases.py: where it went (seconds
  and states per phase, for the report);
- api.py: peakcut.optimize() and optimize_graph(); data_parallel.py: one plan on every rank of a
  DistributedDataParallel step (the ranks' steps compared, rank 0's plan broadcast).
"""

from peakcut.optimizer.api import optimize, optimize_graph
from peakcut.optimizer.children import MoveSettings
from peakcut.optimizer.objective import LimitError, Objective
from peakcut.optimizer.optimized import Optimized
from peakcut.optimizer.plan import LimitNotMet, Plan, load_plan
from peakcut.optimizer.search import Progress, SearchResult

__all__ = ["LimitError", "LimitNotMet", "MoveSettings", "Objective", "Optimized", "Plan", "Progress",
           "SearchResult", "load_plan", "optimize", "optimize_graph"]
