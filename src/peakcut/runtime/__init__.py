"""Running built steps: peak-memory and time measurement, numeric equivalence with eager."""

from peakcut.runtime.equivalence import EquivalenceReport, check_equivalence
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
    "fake_tracked_peak", "measure", "profiler_peak",
]
