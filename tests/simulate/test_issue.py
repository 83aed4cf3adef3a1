"""An asynchronous device: one host thread issues the nodes in order, each node runs on its
stream once issued (simulate/streams.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

import peakcut
from peakcut.cost import get_cost_model
from peakcut.ir.graph import Graph
from peakcut.simulate import simulate_timeline
from tests.conftest import cnn_loss
from tests.simulate.helpers import FakeCost, random_seconds


@dataclass
class IssuingCost(FakeCost):
    """FakeCost whose nodes also take `issue` seconds of the issuing thread."""

    issue: float = 1.0

    def issue_seconds(self, g: Graph, nid: int) -> float:
        return self.issue


@pytest.fixture
def graph(small_cnn):
    model, batch = small_cnn
    return peakcut.capture(model, batch, cnn_loss, "adamw")


@pytest.mark.parametrize("issue", [0.0, 0.5, 2.0])
def test_a_node_starts_once_issued_and_once_the_stream_is_free(graph, issue):
    cost = IssuingCost(random_seconds(5), issue=issue)
    tl = simulate_timeline(graph, None, cost)
    device = np.array([cost.node_seconds(graph, nid) for nid in tl.order])
    end, issued = 0.0, 0.0
    for i in range(len(tl.order)):
        issued += issue
        begin = max(end, issued)
        end = begin + device[i]
        assert tl.start[i] == pytest.approx(begin) and tl.end[i] == pytest.approx(end)
    assert tl.latency_seconds == pytest.approx(end)


def test_issue_bound_and_device_bound_steps(graph):
    """Tiny device times: the step takes the issuing thread's time; long ones: the device's."""
    n = len(graph.order)
    tiny = simulate_timeline(graph, None, IssuingCost(lambda g, nid: 1e-3, issue=1.0))
    assert tiny.latency_seconds == pytest.approx(n + 1e-3)
    long = simulate_timeline(graph, None, IssuingCost(lambda g, nid: 10.0, issue=1.0))
    assert long.latency_seconds == pytest.approx(1.0 + 10.0 * n)


def test_gpu_profiles_overlap_issue_and_the_cpu_does_not(graph):
    """The analytic GPU profile's step is shorter than its calls' whole times summed (issue
    overlaps the device's work); the CPU profile's step is exactly that sum."""
    for name, overlapped in (("h100", True), ("cpu", False)):
        cost = get_cost_model(name, cpu_threads=2) if name == "cpu" else get_cost_model(name)
        whole = sum(cost.node_seconds(graph, v) + cost.issue_seconds(graph, v) for v in graph.order)
        latency = simulate_timeline(graph, None, cost).latency_seconds
        if overlapped:
            assert latency < whole
        else:
            assert latency == pytest.approx(whole)
