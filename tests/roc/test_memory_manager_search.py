"""The search's swaps against ROC's memory manager on small graphs (bench.roc_memory): at
capacities between the floor and the capture order's peak, the search (swaps only, a fixed
number of states) meets the capacity and moves at most 10% more bytes than the DP's optimum."""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import pytest

from bench.roc_memory import (
    chain_skip,
    diamond,
    floor_bytes,
    gcn_part,
    ops_of,
    order_peak,
    search_bytes,
    two_skips,
)
from peakcut.ir.graph import Graph
from peakcut.roc.memory_manager import MAX_OPS, plan_cache

BUILD: dict[str, Callable[[], Graph]] = {"chain-skip": chain_skip, "two-skips": two_skips, "diamond": diamond,
                                         "gcn-part": gcn_part}


@cache
def _graph(name: str) -> Graph:
    return BUILD[name]()


@pytest.mark.parametrize(("name", "fraction"), [
    ("chain-skip", 0.0), ("chain-skip", 0.5), ("diamond", 0.0), ("diamond", 0.5), ("two-skips", 0.0),
    ("two-skips", 0.5), ("gcn-part", 0.0), ("gcn-part", 0.5),
])
def test_search_moves_at_most_10_percent_more_than_the_dp(name: str, fraction: float) -> None:
    g = _graph(name)
    assert ops_of(g) <= MAX_OPS
    floor, peak = floor_bytes(g), order_peak(g)
    capacity = int(floor + fraction * (peak - floor))
    dp = plan_cache(g, capacity)
    moved, search_peak, met = search_bytes(g, capacity, max_states=12)
    assert met and search_peak <= capacity, f"the search's plan peaks at {search_peak} > {capacity}"
    assert moved <= 1.10 * dp.moved_bytes, f"search {moved} bytes, DP {dp.moved_bytes}"
