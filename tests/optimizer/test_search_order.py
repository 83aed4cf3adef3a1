"""Which states the best-first search expands: a toy space of states, no model.

The moves (optimizer.children) are replaced by a table of made-up (peak, latency) states;
the search itself, its queues and its key are the real ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest

import peakcut.optimizer.search as search_module
from peakcut.optimizer.children import Move
from peakcut.optimizer.objective import Objective
from peakcut.optimizer.search import search


@dataclass
class ToyState:
    name: str
    peak_bytes: int
    latency_s: float
    pending: None = None
    compact: bool = False
    applied: tuple[str, ...] = ()
    program: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(nodes=[]))

    @property
    def digest(self) -> str:
        return self.name


class ToyDeriver:
    rules = SimpleNamespace(move_kinds=("toy",))

    def expected_seconds(self, kind: str) -> float:
        return 0.0

    def expected_exact_seconds(self, state: ToyState) -> float:
        return 0.0

    def record(self, kind: str, t0: float) -> None:
        pass

    def exact(self, state: ToyState) -> ToyState:
        """The full expansion of a compact state: 1% slower than estimated."""
        return ToyState(state.name + "_exact", state.peak_bytes, state.latency_s * 1.01)


def _memory_trap() -> dict[str, list[ToyState]]:
    """Under a memory limit of 50 the root's children are a small but slow plan ("checkpoint
    everything") and a fast one over the limit; only the fast one leads to a fast plan under
    the limit. The slow plan's descendants go on for ever, now and then a little smaller and
    never faster."""
    space: dict[str, list[ToyState]] = {
        "root": [ToyState("slow0", 40, 40.0), ToyState("fast_over", 60, 11.0)],
        "fast_over": [ToyState("fast_under", 45, 12.0)],
    }
    for i in range(200):
        space[f"slow{i}"] = [ToyState(f"slow{i + 1}", 40 - (i + 1) // 20, 40.0)]
    return space


def _latency_trap() -> dict[str, list[ToyState]]:
    """Under a latency limit of 31 the root's children are a plan in time that can only be
    trimmed now and then, and a smaller one too slow; only the slow one leads to a small
    plan in time."""
    space: dict[str, list[ToyState]] = {
        "root": [ToyState("trim0", 50, 20.0), ToyState("small_late", 30, 35.0)],
        "small_late": [ToyState("small_in_time", 25, 30.5)],
    }
    for i in range(200):
        space[f"trim{i}"] = [ToyState(f"trim{i + 1}", 50 - (i + 1) // 20, 20.0 - 0.01 * (i + 1))]
    return space


def _use_space(monkeypatch: pytest.MonkeyPatch, space: dict[str, list[ToyState]]) -> None:
    def children(state: ToyState, deriver: ToyDeriver, settings: object, rng: object) -> list[Move]:
        return [Move("toy", (c.name,), c.name, lambda c=c: c) for c in space.get(state.name, [])]

    monkeypatch.setattr(search_module, "children", children)
    monkeypatch.setattr(search_module, "make_key", lambda state: (state.name,))


def test_memory_mode_finds_the_cheaper_plan_through_a_state_over_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a slow plan meets the limit, a faster state over the limit is still expanded: the
    search returns the fast plan under the limit, not the slow one's ever smaller descendants."""
    _use_space(monkeypatch, _memory_trap())
    root = ToyState("root", 100, 10.0)
    result = search(root, ToyDeriver(), Objective("memory", 50), time_budget=30, max_states=60)
    assert result.best.name == "fast_under"


def test_latency_mode_finds_the_smaller_plan_through_a_state_over_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same in latency mode: a state slower than allowed but smaller than the best in time
    is expanded, and its child in time is the smallest plan."""
    _use_space(monkeypatch, _latency_trap())
    root = ToyState("root", 100, 10.0)
    result = search(root, ToyDeriver(), Objective("latency", 31.0), time_budget=30, max_states=60)
    assert result.best.name == "small_in_time"


def test_an_older_best_is_returned_when_the_latest_miss_the_limit_on_the_full_expansion(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Compact estimates 1% optimistic: the three latest bests, estimated just under the latency
    limit, all miss it on the full expansion. The one before them, with room to spare, is
    derived and returned, not the untransformed root."""
    def compact(name: str, peak: int, latency: float) -> ToyState:
        return ToyState(name, peak, latency, compact=True)
    _use_space(monkeypatch, {
        "root": [compact("roomy", 50, 25.0)],
        "roomy": [compact("edge1", 45, 30.95)],
        "edge1": [compact("edge2", 44, 30.96)],
        "edge2": [compact("edge3", 43, 30.97)],
    })
    result = search(ToyState("root", 100, 10.0), ToyDeriver(), Objective("latency", 31.0), time_budget=30)
    assert result.best.name == "roomy_exact"


def test_the_best_exact_state_is_returned_when_every_estimated_best_misses_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The only best after the root is estimated just under the latency limit and misses it on
    the full expansion; a state built later with exact figures, never the best, meets it and
    is returned instead of the root."""
    _use_space(monkeypatch, {
        "root": [ToyState("edge", 45, 30.99, compact=True)],
        "edge": [ToyState("exact_in_time", 50, 25.0)],
    })
    result = search(ToyState("root", 100, 10.0), ToyDeriver(), Objective("latency", 31.0), time_budget=30)
    assert result.best.name == "exact_in_time"


def test_a_compact_best_at_the_limit_is_derived_at_once_and_the_search_goes_on_from_what_is_true(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The root's child is estimated just under the latency limit and misses it on the full
    expansion (the toy's estimates are 1% optimistic); its own child is larger but has room to
    spare. Judged on estimates alone, the edge state stays the best, its child never becomes
    one, and the search returns the untransformed root. Derived as soon as it is the best, the
    edge state falls back, the roomy child becomes the best and is returned."""
    _use_space(monkeypatch, {
        "root": [ToyState("edge", 40, 30.95, compact=True)],
        "edge": [ToyState("roomy", 45, 25.0, compact=True)],
    })
    result = search(ToyState("root", 100, 10.0), ToyDeriver(), Objective("latency", 31.0), time_budget=30)
    assert result.best.name == "roomy_exact"
    assert [b.name for b in result.bests] == ["root", "edge", "root", "roomy"]


def test_the_margin_learnt_in_the_search_keeps_later_estimates_off_the_limit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a derivation showed estimates 1% optimistic, a later compact state estimated 0.5%
    under the limit is judged as missing it: it never becomes the best."""
    _use_space(monkeypatch, {
        "root": [ToyState("edge", 40, 30.95, compact=True)],
        "edge": [ToyState("roomy", 45, 25.0, compact=True)],
        "roomy": [ToyState("close", 42, 30.85, compact=True)],
    })
    result = search(ToyState("root", 100, 10.0), ToyDeriver(), Objective("latency", 31.0), time_budget=30)
    assert "close" not in [b.name for b in result.bests]
    assert result.best.name == "roomy_exact"
