"""Running built steps: peak-memory and time measurement, numeric equivalence with eager.

- measure.py: peak memory and time of a built step, measured three ways (CPU profiler, CUDA,
  fake tracker); workspace_hook.py: an op call's workspace for the fake tracker;
- equivalence.py: a built step against eager PyTorch over several steps;
- host_allocator.py: host memory kept by the allocator, so freed tensors do not page-fault, and
  given back once a search is done."""

from peakcut.runtime.equivalence import EquivalenceReport, check_equivalence
from peakcut.runtime.host_allocator import keep_freed_host_memory, release_freed_host_memory
from peakcut.runtime.measure import (
    METHODS,
    Measurement,
    allocator_events,
    fake_tracked_peak,
    measure,
    profiler_peak,
)

__all__ = [
    "METHODS", "EquivalenceReport", "Measurement", "allocator_events", "check_equivalence",
    "fake_tracked_peak", "release_freed_host_memory", "keep_freed_host_memory", "measure", "profiler_peak",
]
