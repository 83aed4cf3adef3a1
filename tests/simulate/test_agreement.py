"""With nothing swapped (or copies inline), the timeline's memory is exactly the step simulation (peakcut.memory.simulate)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import peakcut
from peakcut.ir.graph import Graph
from peakcut.memory import simulate
from peakcut.simulate import COMPUTE, simulate_timeline
from peakcut.workloads import get_workload
from tests.conftest import SmallCNN, cnn_loss
from tests.simulate.helpers import FakeCost, constant, random_seconds, random_topological_order


def _small_cnn_graph(optimizer: str) -> Graph:
    torch.manual_seed(0)
    batch = (torch.randn(2, 3, 8, 8), torch.randint(0, 5, (2,)))
    return peakcut.capture(SmallCNN(), batch, cnn_loss, optimizer)


@pytest.fixture(scope="module")
def cnn_adamw() -> Graph:
    return _small_cnn_graph("adamw")


@pytest.fixture(scope="module", params=["small_cnn-sgd", "bert-base", "resnet50"])
def captured(request: pytest.FixtureRequest) -> Graph:
    if request.param == "small_cnn-sgd":
        return _small_cnn_graph("sgd")
    inst = get_workload(request.param).build("tiny")
    return peakcut.capture(inst.model, inst.batch, inst.loss_fn, "adamw")


def assert_matches_spine(g: Graph, order: list[int] | None, cost: FakeCost,
                         workspace: str | None) -> None:
    """Peak, per-node memory, peak node and hot-spots equal those of peakcut.memory.simulate."""
    prof = simulate(g, order, workspace=workspace)
    tl = simulate_timeline(g, order, cost, workspace=workspace)
    assert tl.order == prof.order
    assert tl.baseline_bytes == prof.baseline_bytes
    assert tl.peak_bytes == prof.peak_bytes == int(tl.bytes.max())
    assert [tl.memory_at(nid) for nid in prof.order] == prof.timeline.tolist()
    assert tl.peak_node == prof.peak_node
    assert tl.peak_time == tl.start_of(prof.peak_node)
    assert sorted((h.storage, h.bytes) for h in tl.hotspots) == sorted(
        (h.storage, h.bytes) for h in prof.hotspots)


@pytest.mark.parametrize("workspace", ["cpu", None])
@pytest.mark.parametrize("overlap", [True, False])
def test_capture_order_matches_spine(captured, workspace, overlap):
    assert_matches_spine(captured, None, FakeCost(random_seconds(1), overlap), workspace)


def test_zero_latency_everywhere_matches_spine(captured):
    """All events at time 0: only the logical sequence orders frees before allocations."""
    assert_matches_spine(captured, None, FakeCost(constant(0.0)), "cpu")


def test_sequential_latency_is_the_sum(cnn_adamw):
    cost = FakeCost(random_seconds(7))
    tl = simulate_timeline(cnn_adamw, None, cost)
    total = sum(cost.node_seconds(cnn_adamw, nid) for nid in cnn_adamw.order)
    assert tl.latency_seconds == pytest.approx(total)
    assert set(tl.stream) == {COMPUTE}
    assert tl.exposed_copy_seconds == 0.0
    starts, ends = tl.start, tl.end
    assert (starts[1:] == ends[:-1]).all()  # back to back on one stream


@settings(max_examples=25, deadline=None)
@given(order_seed=st.integers(0, 2**32 - 1), cost_seed=st.integers(0, 2**32 - 1),
       zero_share=st.sampled_from([0.0, 0.3, 1.0]), workspace=st.sampled_from(["cpu", None]),
       overlap=st.booleans())
def test_random_orders_match_spine(cnn_adamw, order_seed, cost_seed, zero_share, workspace,
                                   overlap):
    order = random_topological_order(cnn_adamw, order_seed)
    cost = FakeCost(random_seconds(cost_seed, zero_share), overlap)
    assert_matches_spine(cnn_adamw, order, cost, workspace)
