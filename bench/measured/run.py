"""Running the configurations: peaks, interleaved rounds against eager, numbers against eager."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from bench.measured.configs import Built
from bench.peers.measure import caller_held_bytes
from peakcut.optimizer.verify import noise_band
from peakcut.runtime import profiler_peak


@dataclass
class Cell:
    """What one configuration measured on one workload (times in seconds, bytes)."""

    workload: str
    name: str
    peak_bytes: int = 0
    host_bytes: int = 0                     # peakcut swaps: host copies (the same RAM on a CPU)
    held_bytes: int = 0                     # held between steps: parameters, buffers, optimizer state, batch
    times: list[float] = field(default_factory=list)
    eager_times: list[float] = field(default_factory=list)    # eager's runs in the same rounds
    setup_seconds: float = 0.0
    budget_seconds: float = 0.0             # peakcut: the time_budget its optimize call was given
    note: str = ""
    error: str = ""
    numbers: dict[str, Any] = field(default_factory=dict)     # peakcut: the check against eager
    predicted: dict[str, Any] = field(default_factory=dict)   # peakcut: the plan's report figures

    @property
    def ratio(self) -> float:
        """Median over the rounds of this configuration's time / eager's in the same round."""
        return statistics.median(t / e for t, e in zip(self.times, self.eager_times, strict=True))

    @property
    def noise(self) -> float:
        return noise_band(self.eager_times)


def peak_of(built: Built, batch: Sequence[torch.Tensor]) -> tuple[int, int, int]:
    """(caller-held bytes + the allocator's peak over one step, host bytes of a plan's
    swaps, the caller-held bytes alone)."""
    delta, _ = profiler_peak(built.step)
    held = caller_held_bytes(built.model, built.optimizer, batch)
    host = built.plan.program.host_peak_bytes if built.plan is not None else 0
    return held + delta, host, held


def interleaved(eager: Callable[[], Any], steps: Sequence[Callable[[], Any]], rounds: int
                ) -> tuple[list[float], list[list[float]]]:
    """`rounds` rounds of eager then every step, each timed on its own."""
    eager_times: list[float] = []
    times: list[list[float]] = [[] for _ in steps]
    for _ in range(rounds):
        for run, into in ((eager, eager_times), *zip(steps, times, strict=True)):
            t0 = time.perf_counter()
            run()
            into.append(time.perf_counter() - t0)
    return eager_times, times
