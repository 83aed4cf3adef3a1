"""Timing primitives: loop and interleaved timing, filler padding, settings validation."""

from __future__ import annotations

import time

import pytest
import torch

from peakcut.cost.timer import (
    MIN_INTERLEAVED,
    TimingSettings,
    copy_call,
    threads_hot,
    time_call,
    time_calls,
    time_interleaved,
    wake_threads,
)

CPU = torch.device("cpu")
FAST = TimingSettings(warmup=1, repeats=3, min_loop_seconds=2e-5, rounds=5, retries=0)


def _sleeper(seconds: float):
    def call() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
    return call


def test_interleaved_times_each_call_and_pads_small_batches():
    made = []
    filler = [lambda: made.append(1)]
    fast, slow = _sleeper(1e-6), _sleeper(3e-4)
    seconds = time_interleaved([fast, slow], CPU, FAST, filler)
    assert len(seconds) == 2 and 0 < seconds[0] < seconds[1]
    assert seconds[1] >= 3e-4
    assert len(made) == FAST.warmup + FAST.rounds  # one filler call per round

    made.clear()
    time_interleaved([fast] * MIN_INTERLEAVED, CPU, FAST, filler)
    assert not made  # big batches need no filler


def test_past_the_deadline_one_round_is_timed_and_no_more():
    made = []
    seconds = time_calls([_sleeper(1e-5)], CPU, FAST, [lambda: made.append(1)], deadline=time.perf_counter())
    assert len(seconds) == 1 and seconds[0] >= 1e-5
    assert len(made) == FAST.warmup + 1


def test_loop_timing_and_mode_switch():
    slow = _sleeper(1e-4)
    assert time_call(slow, CPU, FAST) >= 1e-4
    looped = time_calls([slow], CPU, TimingSettings(warmup=1, repeats=3, interleave=False))
    interleaved = time_calls([slow], CPU, FAST)
    assert looped[0] >= 1e-4 and interleaved[0] >= 1e-4


def test_copy_call_copies_the_bytes():
    out = copy_call(1000, "d2h", CPU)()
    assert out.dtype == torch.uint8 and out.numel() == 1000


def test_thread_probe_answers():
    assert isinstance(threads_hot(CPU), bool)
    assert isinstance(wake_threads(CPU, max_seconds=0.01), bool)


@pytest.mark.parametrize("bad", [dict(repeats=0), dict(rounds=0), dict(warmup=-1),
                                 dict(min_loop_seconds=0.0), dict(retries=-1)])
def test_bad_settings_are_rejected(bad):
    with pytest.raises(ValueError):
        TimingSettings(**bad)
