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


def test_a_long_batch_runs_fewer_rounds_and_a_short_one_all() -> None:
    """Rounds as many as batch_seconds holds at the warm-up's pace, at least min_rounds (one
    warm-up when a round alone is longer); a batch of fast calls keeps every round."""
    made = {"slow": 0, "fast": 0}

    def counted(name: str, seconds: float):
        work = _sleeper(seconds)

        def call() -> None:
            made[name] += 1
            work()
        return call

    settings = TimingSettings(warmup=2, rounds=11, min_rounds=3, batch_seconds=0.01, retries=0)
    time_interleaved([counted("slow", 0.03)], CPU, settings)
    assert made["slow"] == 1 + 3
    time_interleaved([counted("fast", 0.0)], CPU, TimingSettings(rounds=11, retries=0))
    assert made["fast"] == 2 + 11
    with pytest.raises(ValueError):
        TimingSettings(min_rounds=0)
    with pytest.raises(ValueError):
        TimingSettings(batch_seconds=0.0)
