"""Per-line overhead of a generated program beyond its calls timed by the measured model.

A generated program pays per line a little more than the call itself: the name lookups of
``aten.op.overload``, binding the result and its ``del``. This module measures that once
per machine: it times a generated program of ``LINES`` lines cycling through the mix of
peakcut.cost.mix, subtracts the time of the same calls timed the way the measured model times
nodes (interleaved on CPU, in the same order; looped on CUDA) and divides by the line count.
The measured model adds the result to every node. With loop timing (TimingSettings
interleave=False) it also contains what loops hide: a different op on every line keeps the
interpreter's and dispatcher's instruction cache and branch predictors cold (~1.2 us per line
on the 2-core AMD EPYC VM this was developed on, against ~0.1 us with interleaved timing).
"""

from __future__ import annotations

import statistics

import torch

from peakcut.cost.mix import MIX, mix_calls, mix_operands, mix_program
from peakcut.cost.timer import TimingSettings, loop_seconds, time_calls

LINES = 200
PROGRAM_REPEATS = 21
ROUNDS = 3  # the calibration is repeated and the median taken: robust to a busy machine


def line_overhead_seconds(device: torch.device, settings: TimingSettings) -> float:
    """Seconds a generated program spends per line beyond its timed call (>= 0)."""
    lines = [i % len(MIX) for i in range(LINES)]
    program = mix_program(lines)
    operands = mix_operands(device)
    calls = mix_calls(operands)

    def run() -> None:
        program(**operands)

    estimates = []
    with torch.no_grad():
        for _ in range(max(settings.warmup, 2)):
            run()
        for _ in range(ROUNDS):
            runs = [loop_seconds(run, 1, device) for _ in range(PROGRAM_REPEATS)]
            per_call = time_calls(calls, device, settings)
            calls_total = sum(per_call[i] for i in lines)
            estimates.append((statistics.median(runs) - calls_total) / LINES)
    return max(0.0, statistics.median(estimates))
