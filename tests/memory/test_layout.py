"""Arena layouts (peakcut.memory.layout): storages live at the same time never share a byte, the
arena reaches the live-bytes peak where it can, and the optimize report gives its figures."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import peakcut
from peakcut.memory import simulate
from peakcut.memory.layout import layout_intervals, overlaps, plan_layout
from peakcut.memory.lifetimes import NodeEvents, interval_peak, step_lifetimes
from peakcut.optimizer.arena import one_stream
from peakcut.simulate import simulate_timeline
from tests.conftest import SmallCNN, cnn_loss
from tests.simulate.helpers import FakeCost, insert_swap, random_seconds, swap_chain

try:
    import scipy  # noqa: F401
    HAVE_SCIPY = True
except ImportError:
    HAVE_SCIPY = False

intervals = st.lists(st.tuples(st.integers(0, 12), st.integers(1, 6), st.integers(1, 40)), min_size=1, max_size=9)


def _arrays(spec: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lo = np.array([a for a, _, _ in spec], dtype=np.int64)
    hi = lo + np.array([d for _, d, _ in spec], dtype=np.int64)
    size = np.array([s for _, _, s in spec], dtype=np.int64)
    return size, lo, hi


@settings(max_examples=60, deadline=None)
@given(intervals)
def test_greedy_layouts_never_overlap_and_never_beat_the_peak(spec: list[tuple[int, int, int]]) -> None:
    size, lo, hi = _arrays(spec)
    offsets, arena, _, optimal = layout_intervals(size, lo, hi, points=20, exact=False)
    assert overlaps(offsets, size, lo, hi) == []
    peak = interval_peak(size, lo, hi, 20)
    assert arena == int((offsets + size).max()) >= peak
    assert optimal == (arena == peak)


@pytest.mark.skipif(not HAVE_SCIPY, reason="the exact layout needs scipy")
@settings(max_examples=25, deadline=None)
@given(intervals)
def test_exact_layouts_never_overlap_and_never_lose_to_greedy(spec: list[tuple[int, int, int]]) -> None:
    size, lo, hi = _arrays(spec)
    _, greedy, _, _ = layout_intervals(size, lo, hi, points=20, exact=False)
    offsets, arena, _, _ = layout_intervals(size, lo, hi, points=20, exact=True)
    assert overlaps(offsets, size, lo, hi) == []
    assert interval_peak(size, lo, hi, 20) <= arena <= greedy


@pytest.mark.skipif(not HAVE_SCIPY, reason="the exact layout needs scipy")
def test_the_exact_model_reaches_the_peak_where_every_greedy_order_misses_it() -> None:
    lo = np.array([2, 5, 3, 4, 2, 0], dtype=np.int64)
    hi = np.array([6, 7, 6, 6, 5, 4], dtype=np.int64)
    size = np.array([4, 5, 2, 3, 1, 5], dtype=np.int64)
    offsets, arena, method, optimal = layout_intervals(size, lo, hi, points=8, exact=False)
    assert arena == 15 and not optimal                  # the peak is 14
    offsets, arena, method, optimal = layout_intervals(size, lo, hi, points=8, exact=True)
    assert (arena, method, optimal) == (14, "exact (HiGHS)", True)
    assert overlaps(offsets, size, lo, hi) == []


def _placed(lay: peakcut.memory.layout.Layout) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    life = lay.lifetimes
    keep = [k for k, s in enumerate(life.storages) if s in lay.offsets]
    size = -(-life.size[keep] // lay.align) * lay.align
    offsets = np.array([lay.offsets[life.storages[k]] for k in keep], dtype=np.int64)
    return offsets, size, life.alloc_at[keep], life.free_at[keep]


def test_a_captured_step_is_laid_out_at_its_live_peak() -> None:
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))), cnn_loss, "adamw")
    lay = plan_layout(g, g.order)
    assert overlaps(*_placed(lay)) == []
    assert lay.live_peak_bytes + lay.held_bytes == simulate(g, g.order, workspace=None).peak_bytes
    assert lay.fragmentation <= 1.03
    assert set(lay.held) == g.caller_held_storages() - g.host_storages()
    assert not set(lay.held) & lay.offsets.keys()
    assert all(off % lay.align == 0 for off in lay.offsets.values())
    left_out = next(iter(lay.offsets))
    fewer = plan_layout(g, g.order, unplanned={left_out})
    assert fewer.unplanned == (left_out,) and left_out not in fewer.offsets
    assert fewer.unplanned_bytes == g.storages[left_out]


def test_a_timed_order_with_a_swap_is_laid_out_on_the_curve_s_lifetimes() -> None:
    g, a, exp, dot = swap_chain(between=5)
    g, _, _ = insert_swap(g, a, exp, dot, [dot])
    timed = simulate_timeline(g, g.order, FakeCost(random_seconds(3)), workspace=None)
    events = NodeEvents(start=timed.start_index, end=timed.end_index, end_time=timed.end, points=len(timed.bytes))
    lay = plan_layout(g, g.order, events=events, align=1)
    assert overlaps(*_placed(lay)) == []
    assert lay.live_peak_bytes + lay.held_bytes == timed.peak_bytes


def test_one_stream_timed_lifetimes_are_the_positional_ones() -> None:
    g, _, _, _ = swap_chain(between=4)                     # no copy: every node on the compute stream
    timed = simulate_timeline(g, g.order, FakeCost(random_seconds(5)), workspace=None)
    events = NodeEvents(start=timed.start_index, end=timed.end_index, end_time=timed.end, points=len(timed.bytes))
    by_time = step_lifetimes(g, g.order, events)
    by_position = step_lifetimes(g, g.order)
    assert by_time.alloc_at.tolist() == by_position.alloc_at.tolist()
    assert by_time.free_at.tolist() == by_position.free_at.tolist()
    assert one_stream(g, g.order, FakeCost(random_seconds(5)))


def test_bad_arguments_are_refused() -> None:
    g, _, _, _ = swap_chain(between=2)
    with pytest.raises(ValueError, match="align"):
        plan_layout(g, g.order, align=0)
    with pytest.raises(ValueError, match="exact"):
        plan_layout(g, g.order, exact="yes")


def test_the_optimize_report_gives_arena_and_reserved_bytes() -> None:
    torch.manual_seed(0)
    g = peakcut.capture(SmallCNN(), (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,))), cnn_loss, "adamw")
    r = peakcut.optimizer.optimize_graph(g, latency_limit=1.1, device="h100", time_budget=2, max_states=3,
                                         workspace=None).report
    layout = r["layout"]
    assert r["arena_bytes"] >= layout["live_peak_bytes"] > 0
    assert r["fragmentation"] == r["arena_bytes"] / layout["live_peak_bytes"] <= 1.05
    assert layout["live_peak_bytes"] + layout["held_bytes"] <= r["peak_bytes"]
    assert r["predicted_reserved_bytes"] >= layout["predicted_allocated_bytes"] >= r["peak_bytes"]
    assert layout["allocator"] == "cuda" and layout["method"].startswith("simulated (layout of the plan's order)")
