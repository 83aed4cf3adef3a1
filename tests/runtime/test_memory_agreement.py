"""Simulated peak vs measured peak.

- tiny workloads: within 5% of the peak measured on CPU from the allocator's
  profiler events while the generated program runs;
- paper-size workloads: within 1% of the peak tracked over FakeTensors while
  the generated program runs (no real memory).
"""

from __future__ import annotations

import pytest

import peakcut
from peakcut.memory import simulate
from peakcut.workloads import WORKLOAD_NAMES, get_workload


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_tiny_simulated_peak_within_5_percent_of_cpu_measured(name: str, optimizer: str) -> None:
    inst = get_workload(name).build("tiny")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, optimizer)
    assert not [g.nodes[n].op for n in g.nodes if g.is_opaque(n)], "every workload op is in the registry"
    measured = peakcut.measure(peakcut.build(g), inst.model, inst.batch, method="cpu-profiler", repeats=1)
    simulated = simulate(g).peak_bytes
    assert abs(simulated - measured.peak_bytes) <= 0.05 * measured.peak_bytes, (simulated, measured.peak_bytes)


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_paper_simulated_peak_within_1_percent_of_fake_tracked(name: str) -> None:
    inst = get_workload(name).build("paper")
    g = peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")
    tracked = peakcut.measure(peakcut.build(g), inst.model, inst.batch)
    assert tracked.method == "fake-tracker"
    simulated = simulate(g).peak_bytes
    assert abs(simulated - tracked.peak_bytes) <= 0.01 * tracked.peak_bytes, (simulated, tracked.peak_bytes)
