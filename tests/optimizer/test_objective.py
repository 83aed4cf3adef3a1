"""Limits, BetterThan and the relaxation of the two search modes."""

from __future__ import annotations

import math

import pytest

from peakcut.optimizer import LimitError, Objective
from peakcut.optimizer.objective import parse_latency_limit, parse_memory_limit

EAGER = 10 * 2**30


@pytest.mark.parametrize(("value", "expected"), [
    (0.4, int(0.4 * EAGER)), ("40%", int(0.4 * EAGER)), ("12GB", 12 * 10**9), ("12GiB", 12 * 2**30),
    ("512 MiB", 512 * 2**20), (123456, 123456), ("0.5", int(0.5 * EAGER)), (None, None),
])
def test_memory_limits(value, expected) -> None:
    assert parse_memory_limit(value, EAGER) == expected


@pytest.mark.parametrize("value", [0.0, 1.5, -3, "lots", "12XB", True, "-5%"])
def test_bad_memory_limits_name_the_argument(value) -> None:
    with pytest.raises(LimitError, match="memory_limit"):
        parse_memory_limit(value, EAGER)


@pytest.mark.parametrize(("value", "expected"), [(1.1, 2.2), ("1.1", 2.2), ("110%", 2.2), ("+10%", 2.2)])
def test_latency_limits_are_ratios(value, expected) -> None:
    assert math.isclose(parse_latency_limit(value, 2.0), expected)


@pytest.mark.parametrize("value", [0.9, "fast", False])
def test_bad_latency_limits(value) -> None:
    with pytest.raises(LimitError, match="latency_limit"):
        parse_latency_limit(value, 2.0)


def test_memory_mode_prefers_feasible_then_faster() -> None:
    obj = Objective("memory", 100)
    fast_over = obj.key(120, 1.0)
    slow_under = obj.key(90, 2.0)
    fast_under = obj.key(95, 1.5)
    assert obj.better(slow_under, fast_over)
    assert obj.better(fast_under, slow_under)
    assert obj.better(obj.key(110, 9.0), obj.key(130, 1.0))   # both over: the lower peak


def test_latency_mode_prefers_feasible_then_smaller() -> None:
    obj = Objective("latency", 1.0)
    assert obj.better(obj.key(50, 0.9), obj.key(10, 1.2))
    assert obj.better(obj.key(40, 1.0), obj.key(50, 0.5))


def test_relaxation_keeps_states_within_delta_of_the_best() -> None:
    obj = Objective("latency", 1.0, relaxation=1.1)
    best = obj.key(100, 0.9)
    assert obj.within_relaxation(obj.key(109, 0.5), best)
    assert not obj.within_relaxation(obj.key(111, 0.5), best)
    assert not obj.within_relaxation(obj.key(50, 1.5), best)   # infeasible while the best is not


def test_a_state_over_the_limit_approaches_when_it_beats_the_best_on_the_objective() -> None:
    memory = Objective("memory", 100)
    best = memory.key(90, 2.0)                                # under the limit, slow
    assert memory.approaches(memory.key(120, 1.5), best)      # over, but faster than the best
    assert not memory.approaches(memory.key(120, 2.5), best)  # over and slower: nothing to gain
    assert not memory.approaches(memory.key(95, 1.5), best)   # under the limit: the queue's business
    assert not memory.approaches(memory.key(120, 1.5), memory.key(130, 1.0))   # no best under the limit yet
    latency = Objective("latency", 1.0)
    assert latency.approaches(latency.key(40, 1.2), latency.key(50, 0.9))      # slower than allowed, smaller
    assert not latency.approaches(latency.key(60, 1.2), latency.key(50, 0.9))
