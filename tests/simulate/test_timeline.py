"""The Timeline's fields and helpers, order validation, cost checks and speed."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

import peakcut
from peakcut.ir.edit import GraphEditor
from peakcut.ir.graph import GraphError
from peakcut.memory import simulate
from peakcut.memory.workspace import node_workspace
from peakcut.simulate import CostModel, Timeline, simulate_timeline
from tests.conftest import cnn_loss
from tests.simulate.helpers import FakeCost, GraphBuilder, constant, random_seconds


@pytest.fixture
def graph(small_cnn):
    model, batch = small_cnn
    return peakcut.capture(model, batch, cnn_loss, "adamw")


def test_fake_cost_satisfies_the_protocol():
    assert isinstance(FakeCost(constant(1.0)), CostModel)


def test_curve_and_helpers(graph):
    tl = simulate_timeline(graph, None, FakeCost(random_seconds(3)))
    assert isinstance(tl, Timeline) and tl.cost_name == "fake"
    n = len(graph.order)
    assert len(tl.times) == len(tl.bytes) == 2 * n + 1
    assert tl.times.dtype == np.float64 and tl.bytes.dtype == np.int64
    assert (np.diff(tl.times) >= 0).all()
    assert tl.bytes[0] == tl.baseline_bytes == int(tl.bytes.min())
    outputs = graph.output_storages() - graph.caller_held_storages()
    assert tl.bytes[-1] == tl.baseline_bytes + sum(graph.storages[s] for s in outputs)
    assert tl.latency_seconds == tl.times[-1] == tl.end.max()
    times = tl.node_times()
    for nid in graph.order[::7]:
        assert times[nid] == (tl.start_of(nid), tl.end_of(nid), tl.stream_of(nid))
        assert tl.memory_before(nid) <= tl.memory_at(nid)
    with pytest.raises(KeyError, match="not in this timeline"):
        tl.memory_at(-1)


def test_hotspots_account_for_the_peak(graph):
    tl = simulate_timeline(graph, None, FakeCost(constant(1.0)))
    ws = node_workspace(graph, tl.peak_node, "cpu")
    assert sum(h.bytes for h in tl.hotspots) + ws == tl.peak_bytes
    assert [h.bytes for h in tl.hotspots] == sorted((h.bytes for h in tl.hotspots), reverse=True)
    assert tl.hotspots[0].tensor and tl.hotspots[0].role


def test_custom_order_is_followed(graph):
    order = list(graph.order)
    i = next(i for i in range(len(order) - 1)
             if order[i] not in graph.predecessors(order[i + 1]))
    order[i], order[i + 1] = order[i + 1], order[i]
    tl = simulate_timeline(graph, order, FakeCost(constant(1.0)))
    assert tl.order == tuple(order)
    assert tl.start_of(order[i]) < tl.start_of(order[i + 1])


@pytest.mark.parametrize(("mangle", "message"), [
    (lambda o: o[:-1], "leaves out 1"),
    (lambda o: [*o, 10**9], "not in the graph"),
    (lambda o: [o[0], *o[:-1]], "twice"),
    (lambda o: list(reversed(o)), "before"),
])
def test_invalid_orders_are_rejected(graph, mangle, message):
    with pytest.raises(GraphError, match=message):
        simulate_timeline(graph, mangle(list(graph.order)), FakeCost(constant(1.0)))


def test_control_dependencies_are_enforced(graph):
    order = list(graph.order)
    i = next(i for i in range(len(order) - 1)
             if order[i] not in graph.predecessors(order[i + 1]))
    first, second = order[i], order[i + 1]
    edit = GraphEditor(graph)
    edit.add_control(first, [second])  # first must now run after second
    g = edit.finish()
    with pytest.raises(GraphError, match="before"):
        simulate_timeline(g, order, FakeCost(constant(1.0)))
    order[i], order[i + 1] = second, first
    tl = simulate_timeline(g, order, FakeCost(constant(1.0)))
    assert tl.start_of(first) >= tl.end_of(second)


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_bad_latencies_are_rejected(graph, bad):
    with pytest.raises(ValueError, match="latency"):
        simulate_timeline(graph, None, FakeCost(constant(bad)))


def test_empty_graph():
    g = GraphBuilder().g
    tl = simulate_timeline(g, None, FakeCost(constant(1.0)))
    assert tl.latency_seconds == 0.0 and tl.peak_bytes == 0 and tl.peak_node is None


def test_paper_size_graph_is_fast():
    """~9,000 nodes (a paper-size step) simulate well under a second."""
    b = GraphBuilder()
    xs = [b.input(f"x{i}", (64, 64)) for i in range(4)]
    live = list(xs)
    for i in range(9000):
        t = b.op("aten.add.Tensor", live[-1], live[-3], shape=(64, 64), name=f"n{i}")
        live.append(t)
    b.output(live[-1])
    cost = FakeCost(constant(1e-4))
    simulate_timeline(b.g, None, cost)  # warm the graph's caches
    t0 = time.perf_counter()
    tl = simulate_timeline(b.g, None, cost)
    assert time.perf_counter() - t0 < 1.0
    assert tl.peak_bytes == simulate(b.g).peak_bytes
