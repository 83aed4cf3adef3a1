"""Timeline simulation: a graph, an issue order and a cost model give the step's latency,
its device memory over time, the peak and what is live there.

    from peakcut.simulate import simulate_timeline
    tl = simulate_timeline(g, order, cost)      # cost: any CostModel
    tl.latency_seconds, tl.peak_bytes, tl.memory_at(nid)
"""

from peakcut.cost.protocol import CostModel
from peakcut.simulate.streams import COMPUTE, D2H, H2D, STREAMS
from peakcut.simulate.timeline import Timeline, simulate_timeline

__all__ = ["COMPUTE", "D2H", "H2D", "STREAMS", "CostModel", "Timeline", "simulate_timeline"]
