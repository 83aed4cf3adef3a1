"""Per-op latency models behind one interface (CostModel), from two sources.

    cost = get_cost_model("h200")            # analytic, from vendor figures
    cost = get_cost_model("measured")        # timed on this machine, cached on disk
    cost.node_seconds(g, nid); cost.copy_seconds(nbytes, "d2h"); step_seconds(cost, g, order)

- protocol.py: the CostModel interface; model.py: getting a model by name;
- analytic.py: the roofline model; profiles.py: the device profiles it reads; links.py: the
  links between ranks and what a collective costs on them;
- measured.py: every distinct call timed on the local device; cache.py: its on-disk cache,
  fingerprint.py: what a cache file depends on; fitted.py: prices of calls not measured yet,
  fitted to the measured calls of their family;
- calls.py: a node's call as a cost model sees it (key, meta tensors, work); inputs.py: real
  argument tensors for timing a call; timer.py: timing calls as a generated program makes them;
- overhead.py: a generated program's per-line overhead; mix.py: the mix of cheap calls that
  calibrates it.

See docs/cost.md.
"""

from peakcut.cost.analytic import AnalyticCostModel
from peakcut.cost.cache import SCHEMA_VERSION, CostCache, default_cache_dir
from peakcut.cost.measured import MeasuredCostModel
from peakcut.cost.model import KNOWN_SPECS, CostModel, get_cost_model, step_seconds
from peakcut.cost.profiles import PROFILE_NAMES, DeviceProfile, get_profile
from peakcut.cost.timer import TimingSettings

__all__ = [
    "KNOWN_SPECS", "PROFILE_NAMES", "SCHEMA_VERSION", "AnalyticCostModel", "CostCache",
    "CostModel", "DeviceProfile", "MeasuredCostModel", "TimingSettings", "default_cache_dir",
    "get_cost_model", "get_profile", "step_seconds",
]
