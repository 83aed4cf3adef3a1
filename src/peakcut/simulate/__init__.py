"""Timeline simulation: a graph, an issue order and a cost model give the step's latency,
its device memory over time, the peak and what is live there.

    from peakcut.simulate import simulate_timeline
    tl = simulate_timeline(g, order, cost)      # cost: any CostModel
    tl.latency_seconds, tl.peak_bytes, tl.memory_at(nid)

- timeline.py: the Timeline (latency, per-node times, memory over time, peak);
- order.py: the issue order, validated, with each node's inputs and dependencies;
- streams.py: when each node starts and ends on the compute, copy and host streams;
- memory.py: the device-memory curve of a timed issue order.
"""

from peakcut.cost.protocol import CostModel
from peakcut.simulate.streams import COMPUTE, D2H, H2D, STREAMS
from peakcut.simulate.timeline import Timeline, simulate_timeline

__all__ = ["COMPUTE", "D2H", "H2D", "STREAMS", "CostModel", "Timeline", "simulate_timeline"]
