"""Running built steps: peak-memory and time measurement, numeric equivalence with eager."""

from peakcut.runtime.equivalence import EquivalenceReport, check_equivalence
from peakcut.runtime.host_allocator import keep_freed_host_memory
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
    "fake_tracked_peak", "keep_freed_host_memory", "measure", "profiler_peak",
]
