"""Device memory of a training step: when each storage is live, the peak, what is live there.

    from peakcut.memory import simulate
    profile = simulate(g, order)          # MemoryProfile: timeline, peak_bytes, hotspots

liveness.py holds the alloc/free rules once, in array form; every simulator uses them:
the step simulation here (step.py), the timed memory curve of peakcut.simulate and the
scheduler's Problem. hotspots.py describes what is live at a peak; workspace/ models the
transient scratch of each op (per machine).
"""

from peakcut.memory.hotspots import PeakStorage
from peakcut.memory.step import MemoryProfile, simulate, tensor_lifetimes

__all__ = ["PeakStorage", "MemoryProfile", "simulate", "tensor_lifetimes"]
