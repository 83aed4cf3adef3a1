"""Device memory of a training step: when each storage is live, the peak, what is live there.

    from peakcut.memory import simulate
    profile = simulate(g, order)          # MemoryProfile: timeline, peak_bytes, hotspots

liveness.py holds the alloc/free rules once, in array form; every simulator uses them:
the step simulation here (step.py), the timed memory curve of peakcut.simulate and the
scheduler's Problem. hotspots.py describes what is live at a peak; workspace/ models the
transient scratch of each op (per machine).

Where the bytes lie: lifetimes.py renumbers the lifetimes in the memory curve's event points
(one stream or timed); layout.py gives every storage an offset in one arena (best of
layout_greedy.py's greedy orders, layout_exact.py's HiGHS model on small steps);
caching_allocator.py models PyTorch's CUDA caching allocator and host_heap.py the host heap
CPU tensors come from (glibc's malloc keeping freed memory, or under its defaults);
allocations.py replays a step's allocation sequence on them to predict reserved bytes.
"""

from peakcut.memory.hotspots import PeakStorage
from peakcut.memory.step import MemoryProfile, simulate, tensor_lifetimes

__all__ = ["PeakStorage", "MemoryProfile", "simulate", "tensor_lifetimes"]
