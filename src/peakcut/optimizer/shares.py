"""How one optimize call shares its time budget, and the defaults and margins of its limits.

optimize_graph: the memory-aware re-order takes REORDER_SHARE of it, a measured cost model
measures new calls until MEASURE_SHARE of it, and the polish keeps POLISH_SHARE of what the
search is given. optimize with verification: the calibration may take CALIBRATE_SHARE, and
VERIFY_SHARE (at least VERIFY_MARGIN x what running eager and one plan takes) is kept for
running VERIFY_CANDIDATES candidate plans; under a latency limit the search plans to
PLAN_MARGIN below it (docs/optimize.md).
"""

from __future__ import annotations

DEFAULT_LATENCY_LIMIT = 1.10      # MAGIS's default: least memory within 10% of eager latency
REORDER_SHARE = 0.1               # share of the time budget the initial re-ordering may take
MEASURE_SHARE = 0.8               # a measured cost model measures new calls until this share
POLISH_SHARE = 0.03               # of the search's time, kept for the polish (optimizer.polish)
VERIFY_SHARE = 0.25               # of the time budget kept for running candidate plans (verify=True)
CALIBRATE_SHARE = 0.45            # of the time budget the calibration may take, measuring the calls included (verify=True; docs/cost.md)
PLAN_MARGIN = 0.02                # of a latency limit the search keeps free where verification follows: its
# plans predicted at the limit measure either side of it by the run's noise (medium ResNet-50
# x1.098, U-Net x1.103), and one over it loses to the untransformed step
VERIFY_CANDIDATES = 3             # transformed candidates run for real (the untransformed step besides)
VERIFY_MARGIN = 1.15              # verification keeps at least this x what eager and one plan take (verify.needed_seconds)
