"""peakcut's measurements print nothing: kineto's `USDT: ... profiler_start` / `profiler_stop`
notices, written from C++ to file descriptor 2 whenever a profiler session starts or stops,
never reach the terminal, and whatever else is written there keeps its place."""

from __future__ import annotations

import os

import pytest
import torch

from peakcut.memory.workspace import measure_calls
from peakcut.memory.workspace.profiler import allocator_profile, without_notices
from peakcut.runtime.measure import profiler_peak


def test_measured_calls_print_no_profiler_notices(capfd: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(64, 64)
    peak, _ = profiler_peak(lambda: x @ x)
    (workspace,) = measure_calls([lambda: x @ x])
    with allocator_profile() as prof:
        y = x + 1
    out, err = capfd.readouterr()
    assert "USDT" not in out + err and "profiler_st" not in out + err, out + err
    assert peak >= y.numel() * y.element_size() and workspace >= 0
    assert any(e.name() == "[memory]" for e in prof.profiler.kineto_results.events())


def test_other_output_keeps_its_place(capfd: pytest.CaptureFixture[str]) -> None:
    os.write(2, b"before\n")
    with without_notices():
        os.write(2, b"USDT:2026-01-01 1:1 X.cpp:52] profiler_start\ninside\n")
    os.write(2, b"after\n")
    assert capfd.readouterr().err == "before\ninside\nafter\n"
