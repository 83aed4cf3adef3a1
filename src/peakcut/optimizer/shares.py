"""How one optimize call shares its time budget, and the defaults and margins of its limits.

optimize_graph: the memory-aware re-order takes REORDER_SHARE of it, the plan's arena layout
at most LAYOUT_SHARE (after the search; its first greedy order always runs), the polish keeps
POLISH_SHARE of what the search is given, and a measured cost model keeps REPRICE_SHARE for
measuring and pricing again the states that can become the plan (optimizer.reprice); during
the search it measures new calls in slices of at most optimizer.budget.MEASURE_DUTY of the
wall time. optimize with verification: the calibration may take CALIBRATE_SHARE, measuring
the step's calls for at most MEASURE_BEFORE_SHARE of it, and VERIFY_SHARE (or VERIFY_MARGIN
x what running eager and one plan MIN_ROUNDS rounds and fingerprinting their updates takes:
optimizer.verification.verify_seconds, where that is more) is kept for running
VERIFY_CANDIDATES candidate plans, but no more than leaves the search SEARCH_SHARE of the
budget (its own seconds: optimizer.api.graph_budget adds REPRICE_SHARE and the layout's),
unless those two at SHORT_ROUNDS rounds need more; under a latency limit the search plans to
PLAN_MARGIN below it (docs/optimize.md, docs/cost.md).
"""

from __future__ import annotations

DEFAULT_LATENCY_LIMIT = 1.10      # MAGIS's default: least memory within 10% of eager latency
REORDER_SHARE = 0.1               # share of the time budget the initial re-ordering may take
LAYOUT_SHARE = 0.05               # of the time budget, at most, for the plan's arena layout (optimizer.arena)
REPRICE_SHARE = 0.04              # of optimize_graph's time budget, kept for optimizer.reprice (measured cost)
MEASURE_BEFORE_SHARE = 0.12       # of the time budget, measuring the step's calls before the search (verify=True)
SEARCH_SHARE = 0.5                # of the time budget, at least, for the search itself (verify=True; measured cost)
POLISH_SHARE = 0.03               # of the search's time, kept for the polish (optimizer.polish)
VERIFY_SHARE = 0.25               # of the time budget kept for running candidate plans (verify=True)
CALIBRATE_SHARE = 0.15            # of the time budget the calibration may take, measuring the calls included (verify=True; docs/cost.md)
PLAN_MARGIN = 0.02                # of a latency limit the search keeps free where verification follows: its
# plans predicted at the limit measure either side of it by the run's noise (medium ResNet-50
# x1.098, U-Net x1.103), and one over it loses to the untransformed step
VERIFY_CANDIDATES = 3             # transformed candidates run for real (the untransformed step besides)
VERIFY_MARGIN = 1.15              # verification asks for this x what eager and one plan take (verification.verify_seconds)
VERIFY_SKIP_BELOW = 0.75          # of what eager and one plan take: verification is skipped with less left; the
# search and the layout after it overrun their shares by seconds, and a plan left unverified for that (medium
# BTLM-3B: 64.2 s left of the 65.9 kept) is worse than a call a few seconds over its budget
# the search's latest bests the arena's choice tries (optimizer.arena); an isolated search sends them back
KEPT_BESTS = 8
